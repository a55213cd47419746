/*
 * bench_pipeline, oneTBB side: the same S-stage workload on tbb::parallel_pipeline, every filter
 * serial_in_order (one item at a time per filter, in input order, like an mbpipe stage), with
 * t->tokens live tokens. TBB's default arena: as many threads as the process may use CPUs, the caller
 * included; its workers are not pinned.
 */
#include <tbb/parallel_pipeline.h>

#include "bench_pipeline.h"

int bp_run_tbb(const struct bp_task *t, struct bp_run *r)
{
	const uint64_t n = t->n;
	const uint64_t *in = t->in;
	uint64_t *out = t->out;
	struct bp_stage *st = t->st;
	uint64_t next = 0;
	const auto mode = tbb::filter_mode::serial_in_order;

	tbb::filter<void, uint64_t> chain =
	    tbb::make_filter<void, uint64_t>(mode, [&next, n, in, st](tbb::flow_control &fc) -> uint64_t {
		    if (next == n) {
			    fc.stop();
			    return 0;
		    }
		    uint64_t v = in[next++];
		    bp_step(&st[0], v);
		    return v;
	    });
	for (unsigned i = 1; i + 1 < t->S; i++)
		chain =
		    chain & tbb::make_filter<uint64_t, uint64_t>(mode, [s = &st[i]](uint64_t v) -> uint64_t {
			    bp_step(s, v);
			    return v;
		    });
	tbb::filter<void, void> all =
	    chain & tbb::make_filter<uint64_t, void>(mode, [s = &st[t->S - 1], out](uint64_t v) {
		    bp_step(s, v);
		    out[v] = v;
	    });

	struct bp_meter m;
	bp_meter_start(&m);
	tbb::parallel_pipeline(t->tokens, all);
	bp_meter_stop(&m, r);
	r->items = n;
	r->errors = next == n ? 0 : 1;
	return 0;
}
