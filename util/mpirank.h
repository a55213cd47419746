/*
 * The tools under mpirun (pipebench, pipeserve): whether the process was started by an MPI launcher,
 * which stages a rank runs, and its part of a model file. Header-only, public API only; no MPI here (the
 * tools include <mbpipe/mpi.h> only when configure found MPI).
 *
 * Stages are spread over the ranks in contiguous ranges, rank 0 the first ones, the first S mod R ranks
 * one stage more. A model's L layers are split into the S stages by layer count (mbp_model_partition on
 * equal costs: every rank computes the same split without reading the others' layers); each rank loads
 * only its stages' layers (mbp_model_load_layers).
 */
#ifndef MBP_UTIL_MPIRANK_H
#define MBP_UTIL_MPIRANK_H

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <mbpipe.h>

/* Started by mpirun (Open MPI), or by another PMI launcher: the environment says how many ranks. */
static inline bool mbt_mpi_launched(void)
{
	return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

/* This process's rank as the launcher's environment gives it (before MPI is initialised), 0 if none: for
 * errors found before the run starts, which rank 0 alone should print. */
static inline unsigned mbt_launcher_rank(void)
{
	static const char *const names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		const char *v = getenv(names[i]);
		if (v)
			return (unsigned)strtoul(v, NULL, 10);
	}
	return 0;
}

/* Rank r of R runs stages [*lo, *hi) of S (S >= R). */
static inline void mbt_rank_stages(unsigned S, unsigned R, unsigned r, unsigned *lo, unsigned *hi)
{
	unsigned base = S / R, extra = S % R;
	*lo = r * base + (r < extra ? r : extra);
	*hi = *lo + base + (r < extra ? 1 : 0);
}

/* The number of layers of a model file and its output width, reading its header and one layer at a time
 * (an exponential then a binary search on mbp_model_load_layers). 0, or the load's error with e set. */
static inline int mbt_file_layers(const char *path, unsigned *layers, uint32_t *out_width, mbp_model_error *e)
{
	mbp_model *m = NULL;
	int rc = mbp_model_load_layers(&m, path, 0, 1, e);
	if (rc)
		return rc;
	mbp_model_destroy(m);
	unsigned lo = 1, hi = 2; /* layer lo - 1 exists; find the first missing one */
	for (;;) {
		rc = mbp_model_load_layers(&m, path, hi - 1, 1, e);
		if (rc == -ENOENT)
			break;
		if (rc)
			return rc;
		mbp_model_destroy(m);
		lo = hi;
		if (hi > MBP_MAX_STAGES * 1024u)
			return -E2BIG;
		hi *= 2;
	}
	while (hi - lo > 1) { /* layer lo - 1 exists, layer hi - 1 does not */
		unsigned mid = lo + (hi - lo) / 2;
		rc = mbp_model_load_layers(&m, path, mid - 1, 1, e);
		if (rc && rc != -ENOENT)
			return rc;
		if (rc == 0) {
			mbp_model_destroy(m);
			lo = mid;
		} else {
			hi = mid;
		}
	}
	rc = mbp_model_load_layers(&m, path, lo - 1, 1, e);
	if (rc)
		return rc;
	*layers = lo;
	*out_width = mbp_model_out_width(m);
	mbp_model_destroy(m);
	return 0;
}

/* Rank r's part of a model of `layers` layers split into S stages over R ranks: its layers loaded into
 * *m (the file's layer *first_layer is its layer 0) and the plan of its stages over them. 0, or the load's
 * error with e set; -ERANGE when S > layers. */
static inline int mbt_load_part(const char *path, unsigned layers, unsigned S, unsigned R, unsigned r,
				mbp_model **m, mbp_model_plan *plan, unsigned *first_layer,
				mbp_model_error *e)
{
	double *cost = malloc(layers * sizeof(*cost));
	if (!cost)
		return -ENOMEM;
	for (unsigned i = 0; i < layers; i++)
		cost[i] = 1;
	mbp_model_plan all;
	int rc = mbp_model_partition(cost, NULL, layers, S, &all);
	free(cost);
	if (rc)
		return rc;
	unsigned lo, hi;
	mbt_rank_stages(S, R, r, &lo, &hi);
	unsigned first = all.first[lo], count = all.first[hi] - first;
	rc = mbp_model_load_layers(m, path, first, count, e);
	if (rc)
		return rc;
	*first_layer = first;
	memset(plan, 0, sizeof(*plan));
	plan->stages = hi - lo;
	plan->layers = count;
	for (unsigned s = 0; s <= hi - lo; s++)
		plan->first[s] = all.first[lo + s] - first;
	plan->balance = 1; /* by layer count: no costs measured */
	return 0;
}

#endif
