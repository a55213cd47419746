/*
 * Each thread's figures of a training step, as both tools report them (pipebench's training workload,
 * pipetrain's summary and --json): the most micro-batches the thread held over its chunks, which the
 * schedule fixes (mbp_schedule_thread_figures), and the outputs and input gradients its stages handed to
 * another thread or passed between its own chunks, which the trainer counted per stage
 * (mbp_train_stage_stats.hops, local_hops) and which must add up, thread by thread, to the schedule's
 * figures (train.h, "Chunks"). One list in one form, "t 2,1; h 8,8 + 0,0", in every text table.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "tools/shared/mlptrain.h"

int mt_thread_figs_get(mt_thread_figs *f, const mbp_schedule *sc, unsigned threads,
		       const mbp_train_stage_stats *ss, unsigned stages, char *why, size_t n)
{
	memset(f, 0, sizeof *f);
	if (!sc || !ss || !threads || threads > MBP_MAX_STAGES)
		return -EINVAL;
	mbp_sched_thread_figures want[MBP_MAX_STAGES];
	for (unsigned t = 0; t < threads; t++)
		if (mbp_schedule_thread_figures(sc, threads, t, &want[t]) < 0)
			return -EINVAL; /* not the schedule's threads (a replicated trainer's copies) */
	f->threads = threads;
	for (unsigned s = 0; s < stages; s++)
		if (ss[s].thread < threads) {
			f->hops[ss[s].thread] += ss[s].hops;
			f->local_hops[ss[s].thread] += ss[s].local_hops;
		}
	int rc = 0;
	for (unsigned t = 0; t < threads; t++) {
		f->held[t] = want[t].held_peak;
		if (rc == 0 && (f->hops[t] != want[t].hops || f->local_hops[t] != want[t].local_hops)) {
			rc = -EPROTO;
			if (why && n)
				snprintf(
				    why, n,
				    "thread %u handed %u items to another thread and passed %u to its own "
				    "chunks, the schedule says %u and %u",
				    t, f->hops[t], f->local_hops[t], want[t].hops, want[t].local_hops);
		}
	}
	return rc;
}

/* "8,8" into buf at *at. */
static void list(char *buf, size_t n, size_t *at, const uint32_t *v, unsigned k)
{
	for (unsigned i = 0; i < k && *at < n; i++) {
		int w = snprintf(buf + *at, n - *at, "%s%u", i ? "," : "", v[i]);
		*at += w > 0 ? (size_t)w : 0;
	}
}

void mt_thread_figs_str(const mt_thread_figs *f, char *buf, size_t n)
{
	size_t at = 0;
	if (!n)
		return;
	if (!f->threads) { /* none to list: a dash, as the tables mark what is not there */
		snprintf(buf, n, "-");
		return;
	}
	buf[0] = 0;
	const char *part[] = {"t ", "; h ", " + "};
	const uint32_t *v[] = {f->held, f->hops, f->local_hops};
	for (unsigned k = 0; k < 3 && at < n; k++) {
		int w = snprintf(buf + at, n - at, "%s", part[k]);
		at += w > 0 ? (size_t)w : 0;
		list(buf, n, &at, v[k], f->threads);
	}
}

void mt_thread_figs_json(void *obj, const mt_thread_figs *f)
{
	cJSON *o = obj;
	const char *key[] = {"thread_held_peak", "thread_hops", "thread_local_hops"};
	const uint32_t *v[] = {f->held, f->hops, f->local_hops};
	for (unsigned k = 0; k < 3; k++) {
		cJSON *a = cJSON_AddArrayToObject(o, key[k]);
		for (unsigned t = 0; a && t < f->threads; t++) /* NULL: out of memory, the key left out */
			cJSON_AddItemToArray(a, cJSON_CreateNumber(v[k][t]));
	}
}
