/*
 * Activity log: per stage, the begin and end of each micro-batch it computed, in bounded memory (the first
 * trace_events per stage; later ones are counted as dropped, not kept), written as a Chrome trace JSON
 * file ("X" complete events, one track per stage) that Perfetto and chrome://tracing open.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>

#include "pipeline_internal.h"

void mbp__trace_add(struct mbp__stage *s, uint64_t t0, uint64_t t1, const mbp_mb *mb)
{
	if (!s->trace)
		return;
	/* relaxed: only this thread writes trace_n */
	uint32_t n = atomic_load_explicit(&s->trace_n, memory_order_relaxed);
	if (n >= s->p->o.trace_events)
		return;
	s->trace[n] = (struct mbp__trace_ev){.t0 = t0,
					     .t1 = t1,
					     .job = mb->job ? mb->job->id : 0,
					     .seq = (uint32_t)mb->seq,
					     .status = mb->status};
	/* release; partner: the acquire load in mbp_pipeline_trace_write(): the event above is complete */
	atomic_store_explicit(&s->trace_n, n + 1, memory_order_release);
}

int mbp_pipeline_trace_write(mbp_pipeline *p, const char *path)
{
	if (!p || !path || !p->o.trace_events)
		return -EINVAL;
	FILE *f = fopen(path, "w");
	if (!f)
		return -errno;
	uint64_t base = p->start_ns;
	fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
	fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"mbpipe\"}}");
	for (unsigned i = 0; i < p->nstages; i++) {
		struct mbp__stage *s = &p->stages[i];
		fprintf(f,
			",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"args\":{\"name\":"
			"\"%u %s (cpu %d)\"}}",
			i, i, s->name, s->cpu);
		/* acquire; partner: the release store in mbp__trace_add(): events below n are complete */
		uint32_t n = s->trace ? atomic_load_explicit(&s->trace_n, memory_order_acquire) : 0;
		for (uint32_t k = 0; k < n; k++) {
			const struct mbp__trace_ev *e = &s->trace[k];
			double ts = (double)(e->t0 - base) / 1e3, dur = (double)(e->t1 - e->t0) / 1e3;
			fprintf(f,
				",\n{\"name\":\"job %" PRIu64
				" mb %u\",\"ph\":\"X\",\"pid\":1,\"tid\":%u,\"ts\":%.3f,"
				"\"dur\":%.3f,\"args\":{\"job\":%" PRIu64
				",\"seq\":%u,\"stage\":%u,\"status\":%d}}",
				e->job, e->seq, i, ts, dur, e->job, e->seq, i, e->status);
		}
	}
	fprintf(f, "\n]}\n");
	int rc = ferror(f) ? -EIO : 0;
	if (fclose(f) != 0 && rc == 0)
		rc = -errno;
	return rc;
}
