/*
 * pipebench progress bar (util/progress.h): one line on standard error, redrawn in place, only when
 * standard error is a terminal (or --progress forces it); never on standard output.
 */
#include "pipebench.h"
#include "util/progress.h"

static struct progress bar;

void pb_progress_init(int mode)
{
	progress_init(&bar, mode);
}

void pb_progress(uint64_t done, uint64_t total, const char *what)
{
	char after[64];
	snprintf(after, sizeof after, "%-16s", what);
	progress_draw(&bar, done, total, "", after);
}

void pb_progress_end(void)
{
	progress_end(&bar);
}
