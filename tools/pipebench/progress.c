/*
 * pipebench progress bar: one line on standard error, redrawn in place, only when standard error is a
 * terminal (or --progress forces it); never on standard output, so --json and --csv stay clean.
 */
#include <stdio.h>
#include <unistd.h>

#include "pipebench.h"

static int enabled;
static int drawn;

void pb_progress_init(int mode)
{
	enabled = mode < 0 ? isatty(STDERR_FILENO) : mode;
}

void pb_progress(uint64_t done, uint64_t total, const char *what)
{
	enum { WIDTH = 30 };
	if (!enabled)
		return;
	unsigned fill = total ? (unsigned)(done * WIDTH / total) : 0;
	if (fill > WIDTH)
		fill = WIDTH;
	char bar[WIDTH + 1];
	for (unsigned i = 0; i < WIDTH; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[WIDTH] = 0;
	if (total)
		fprintf(stderr, "\r[%s] %3u%% %-16s", bar,
			(unsigned)(done * 100 / total > 100 ? 100 : done * 100 / total), what);
	else
		fprintf(stderr, "\r%-16s", what);
	fflush(stderr);
	drawn = 1;
}

void pb_progress_end(void)
{
	if (enabled && drawn)
		fprintf(stderr, "\r%60s\r", "");
	drawn = 0;
}
