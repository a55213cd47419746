/*
 * The progress bar of the tools (pipebench, pipetrain): one line on standard error, redrawn in place
 * ("\r"), only when standard error is a terminal or the user forced it (--progress), never on standard
 * output, so --json and --csv stay clean. At most ten redraws a second (a small model runs thousands of
 * steps a second); the start of a phase (done 0) and its end (done == total) are always drawn.
 * Header-only, one bar per process; shared by pipebench and pipetrain.
 */
#ifndef MBP_UTIL_PROGRESS_H
#define MBP_UTIL_PROGRESS_H

#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "clock.h"

struct progress {
	int on;		/* drawing at all */
	unsigned drawn; /* the longest line drawn since the last progress_end (0: none) */
	double last;	/* when the last line was drawn (CLOCK_MONOTONIC seconds) */
};

/* mode: -1 when standard error is a terminal, 0 never, 1 always. */
static inline void progress_init(struct progress *p, int mode)
{
	*p = (struct progress){.on = mode < 0 ? isatty(STDERR_FILENO) : mode};
}

/* "<before>[#####.....]  42% <after>", or "<before><after>" without a total. */
static inline void progress_draw(struct progress *p, uint64_t done, uint64_t total, const char *before,
				 const char *after)
{
	enum { WIDTH = 30 };
	if (!p->on)
		return;
	double now = mbt_now_s();
	if (done > 0 && done < total && p->drawn && now - p->last < 0.1)
		return;
	p->last = now;
	char line[256];
	int n;
	if (total) {
		uint64_t pct = done * 100 / total, fill = done * WIDTH / total;
		char bar[WIDTH + 1];
		for (unsigned i = 0; i < WIDTH; i++)
			bar[i] = i < fill ? '#' : '.';
		bar[WIDTH] = 0;
		n = snprintf(line, sizeof line, "%s[%s] %3u%% %s", before, bar,
			     (unsigned)(pct > 100 ? 100 : pct), after);
	} else {
		n = snprintf(line, sizeof line, "%s%s", before, after);
	}
	if (n < 0)
		return;
	unsigned len = (unsigned)n < sizeof line ? (unsigned)n : (unsigned)sizeof line - 1;
	fprintf(stderr, "\r%s", line);
	fflush(stderr);
	if (len > p->drawn)
		p->drawn = len;
}

/* Erase the bar (when one was drawn), leaving the cursor at the start of the line. */
static inline void progress_end(struct progress *p)
{
	if (p->on && p->drawn)
		fprintf(stderr, "\r%*s\r", (int)p->drawn, "");
	p->drawn = 0;
}

#endif
