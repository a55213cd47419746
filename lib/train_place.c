/*
 * Where a training schedule's stages run: a chunked or custom schedule's stages on its threads, and a
 * pipeline's stages over the ranks that hold them (the trainer across ranks, lib/mpi/trainer.c, asks
 * this; no MPI here). The block placement (consecutive stages share a thread, schedule.h) needs nothing.
 * Also the one decision of a step that its parts make from their votes (mbp__train_vote_tally).
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "train_internal.h"

int mbp__train_place(const mbp_train_opts *o, unsigned stages, unsigned threads, uint16_t *thread_of,
		     unsigned *placed, const char **what)
{
	mbp_sched_kind kind = o->schedule;
	*placed = 0;
	if (!mbp__sched_kind_placed(kind))
		return 0;
	mbp_schedule *sc;
	int rc;
	*what = "threads: a chunked schedule needs the stages a multiple of the threads (interleaved, looped "
		"BFS) or twice them (ZB-V, DualPipeV)";
	if (o->custom) {
		const mbp_schedule *c = o->custom;
		*what = "schedule: its stage count is not the trainer's";
		if (mbp_schedule_stages(c) != stages)
			return -EINVAL;
		*what = "threads: not the custom schedule's";
		if (threads && threads != mbp_schedule_threads(c))
			return -EINVAL;
		rc = mbp_schedule_copy(&sc, c);
	} else {
		rc = mbp_schedule_new_placed(&sc, kind, stages, stages, threads);
	}
	if (rc < 0)
		return rc;
	*placed = mbp_schedule_threads(sc);
	for (unsigned s = 0; s < stages; s++)
		thread_of[s] = (uint16_t)mbp_schedule_thread_of(sc, s, 0);
	mbp_schedule_destroy(sc);
	return 0;
}

int mbp__train_place_ranks(const mbp_train_opts *o, int ranks, int me, const unsigned *n, const unsigned *th,
			   int *rank_of, unsigned *stages, struct mbp__train_remote *rem, char *err,
			   size_t len)
{
	unsigned tsum = 0, total = 0, placed = 0;
	bool given = true;
	for (int k = 0; k < ranks; k++) {
		if (k == MBP_MAX_STAGES || total + n[k] > MBP_MAX_STAGES) {
			snprintf(err, len, "more than %d stages over all ranks", MBP_MAX_STAGES);
			return -E2BIG;
		}
		tsum += th[k];
		given &= th[k] != 0;
		for (unsigned i = 0; i < n[k]; i++)
			rank_of[total++] = k;
	}
	*stages = total;
	const char *what = NULL;
	uint16_t thr[MBP_MAX_STAGES];
	int rc = mbp__train_place(o, total, given ? tsum : 0, thr, &placed, &what);
	if (rc == -EINVAL)
		snprintf(err, len, "the schedule across ranks: %s", what);
	if (rc < 0 || !placed)
		return rc;
	unsigned on[MBP_MAX_STAGES] = {0}, first = 0, next = 0, rank_t[MBP_MAX_STAGES];
	for (unsigned g = 0; g < total; g++)
		on[thr[g]]++;
	for (int k = 0; k < ranks; k++) {
		unsigned held = 0, t0 = next;
		while (held < n[k] && next < placed)
			held += on[next++];
		if (held != n[k] || (th[k] && next - t0 != th[k])) {
			snprintf(
			    err, len,
			    "the %s schedule places %u stages on its %u threads: rank %d's %u stages%s are "
			    "not whole threads of it",
			    mbp_sched_name(o->schedule), total, placed, k, n[k],
			    th[k] ? " on its threads" : "");
			return -EINVAL;
		}
		for (unsigned t = t0; t < next; t++)
			rank_t[t] = (unsigned)k;
		if (k == me)
			first = t0, rem->threads = next - t0;
	}
	rem->sched_threads = placed;
	for (unsigned g = 0, i = 0; g < total; g++) {
		rank_of[g] = (int)rank_t[thr[g]];
		if (rank_of[g] == me) {
			rem->global[i] = (uint16_t)g;
			rem->thread_of[i++] = (uint16_t)(thr[g] - first);
		}
	}
	return 0;
}

uint64_t mbp__train_schedule_hash(const mbp_schedule *sc)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	const mbp_sched_op *act;
	size_t n = sc ? mbp_schedule_order(sc, &act) : 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t w[2] = {act[i].mb, (uint32_t)act[i].stage << 8 | act[i].kind};
		for (unsigned b = 0; b < 2; b++)
			h = (h ^ w[b]) * 1099511628211ull;
	}
	for (unsigned s = 0; sc && s < mbp_schedule_stages(sc); s++)
		h = (h ^ mbp_schedule_thread_of(sc, s, 0)) * 1099511628211ull;
	return sc ? h : 0;
}

/* Part k's vote in a row of records `stride` bytes apart. */
static const struct mbp__train_vote *vote_of(const void *votes, size_t stride, int k)
{
	return (const void *)((const char *)votes + (size_t)k * stride);
}

void mbp__train_vote_tally(const void *votes, size_t stride, int parts, const int *rank_of, unsigned stages,
			   struct mbp__train_vote *out)
{
	memset(out, 0, sizeof(*out));
	out->ok = true;
	int pick = -1;
	for (int k = 0; k < parts; k++) {
		const struct mbp__train_vote *a = vote_of(votes, stride, k);
		out->ok &= a->ok;
		/* the step's error: the failing stage with the lowest index, else the first part's */
		int low = pick < 0 ? -1 : vote_of(votes, stride, pick)->err.stage;
		if (a->err.err && (pick < 0 || (a->err.stage >= 0 && (low < 0 || a->err.stage < low))))
			pick = k;
	}
	for (unsigned s = 0; s < stages; s++)
		out->grad_sq[s] = vote_of(votes, stride, rank_of[s])->grad_sq[s];
	out->loss = stages ? vote_of(votes, stride, rank_of[stages - 1])->loss : 0;
	out->err = pick >= 0 ? vote_of(votes, stride, pick)->err
			     : (mbp_train_error){.err = -ECANCELED, .stage = -1, .mb = -1};
	if (out->ok)
		out->err = (mbp_train_error){0};
}
