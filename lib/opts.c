/*
 * Pipeline options: defaults and the `key=value,...` form (like jemalloc's MALLOC_CONF), so tests, tools
 * and benchmarks can set them from an environment variable.
 *
 * Two readings of a 0, each the natural one where it is written: in the struct a field's 0 is its default
 * (a zeroed struct is complete once in_row_bytes is set), so a rule accepts it; in the string a value
 * means what it says, so spin_us=0 is no spin (MBP_SPIN_NONE) and ring=0 is refused, not the default.
 * Numbers are read by util/number.h's strict parser, the one the tools' command lines use too.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <string.h>

#include <mbpipe.h>

#include "ring.h"
#include "util/number.h"
#include "wait.h"

void mbp_opts_init(mbp_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->max_mb_rows = 64;
	o->ring_capacity = 16;
	o->ingress_depth = 1024;
	o->mb_buffers = 256;
	o->pool_bytes = (size_t)1 << 30;
	o->cache_size = 32; /* perf/results/pipeline.md: 2-5% faster than 8 at W <= 1 us */
	o->spin_ns = MBP__SPIN_NS_DEFAULT;
	o->yield_ns = MBP__YIELD_NS_DEFAULT;
	o->pinning = MBP_PIN_PLAN;
}

void mbp__opts_fill(mbp_opts *o)
{
	mbp_opts d;
	mbp_opts_init(&d);
	MBP__DEFAULT(o, &d, max_mb_rows);
	MBP__DEFAULT(o, &d, ring_capacity);
	MBP__DEFAULT(o, &d, ingress_depth);
	MBP__DEFAULT(o, &d, mb_buffers);
	MBP__DEFAULT(o, &d, pool_bytes);
	MBP__DEFAULT(o, &d, cache_size);
	MBP__DEFAULT(o, &d, spin_ns);
	MBP__DEFAULT(o, &d, yield_ns);
}

/* ---- rules: one per key, shared by mbp_opts_parse (as each key is set), mbp_opts_check and
 * mbp_pipeline_new, so that a value is refused where it is given, with the same words everywhere ---- */

struct rule {
	const char *key;
	const char *text; /* "key: the rule", one line */
	bool (*ok)(const mbp_opts *o);
	bool zero_is_default; /* a 0 in the struct is the default (ok() passes it); the string refuses it */
};

static bool ok_row_bytes(const mbp_opts *o)
{
	return o->in_row_bytes > 0 && o->in_row_bytes <= UINT32_MAX;
}
static bool ok_ring(const mbp_opts *o)
{
	return o->ring_capacity == 0 ||
	       (o->ring_capacity >= 2 && o->ring_capacity <= MBP__RING_MAX_CAPACITY &&
		mbp__is_pow2(o->ring_capacity));
}
static bool ok_pin(const mbp_opts *o)
{
	return o->pinning == MBP_PIN_PLAN || o->pinning == MBP_PIN_NONE;
}
static bool ok_cpus(const mbp_opts *o)
{
	if (o->ncpus > MBP_MAX_CPUS)
		return false;
	for (uint32_t i = 0; i < o->ncpus; i++)
		if (o->cpus[i] < 0 || o->cpus[i] >= CPU_SETSIZE)
			return false;
	return true;
}
static bool ok_any(const mbp_opts *o)
{
	(void)o;
	return true;
}

#define STR_(x) #x
#define STR(x)	STR_(x)
static const struct rule rules[] = {
    {"row_bytes", "row_bytes: the input row width in bytes, 1 to 4294967295 (required)", ok_row_bytes, false},
    {"max_mb_rows", "max_mb_rows: rows of the largest micro-batch, 1 to 4294967295", ok_any, true},
    {"ring", "ring: slots per hop, a power of two from 2 to 1073741824", ok_ring, true},
    {"ingress", "ingress: entries waiting for stage 0, 1 to 4294967295", ok_any, true},
    {"mb_buffers", "mb_buffers: buffers for mbp_mb_acquire(), 1 to 4294967295", ok_any, true},
    {"pool_mb", "pool_mb: bound of each pool in MiB, 1 to 4294967295", ok_any, true},
    {"cache", "cache: buffers in each worker's cache, 1 to 4294967295", ok_any, true},
    {"spin_us", "spin_us: microseconds, 0 (no spin) to 4294967295", ok_any, false},
    {"yield_us", "yield_us: microseconds, 0 (no yield) to 4294967295", ok_any, false},
    {"pin", "pin: 0 (the OS places the threads) or 1 (pinned per the placement plan, the default)", ok_pin,
     false},
    {"threads", "threads: worker threads, 0 (the default plan) to 4294967295", ok_any, false},
    {"cpus", "cpus: CPU numbers below " STR(CPU_SETSIZE) " as 0-3 or 0+2+5, at most " STR(MBP_MAX_CPUS),
     ok_cpus, false},
    {"trace", "trace: events kept per stage, 0 (off) to 4294967295", ok_any, false},
};
#define NRULES (sizeof(rules) / sizeof(rules[0]))

static const struct rule *rule_of(const char *key, size_t klen)
{
	for (size_t i = 0; i < NRULES; i++)
		if (strlen(rules[i].key) == klen && memcmp(rules[i].key, key, klen) == 0)
			return &rules[i];
	return NULL;
}

int mbp_opts_check(const mbp_opts *o, const char **why)
{
	if (!o) {
		if (why)
			*why = "no options";
		return -EINVAL;
	}
	for (size_t i = 0; i < NRULES; i++) {
		if (!rules[i].ok(o)) {
			if (why)
				*why = rules[i].text;
			return -EINVAL;
		}
	}
	if (why)
		*why = NULL;
	return 0;
}

const char *mbp_opts_rule(const char *kv)
{
	if (!kv)
		return "no option";
	size_t klen = strcspn(kv, "=,");
	const struct rule *r = rule_of(kv, klen);
	if (r)
		return r->text;
	return "unknown key: the keys are row_bytes, max_mb_rows, ring, ingress, mb_buffers, pool_mb, cache, "
	       "spin_us, yield_us, pin, threads, cpus, trace";
}

/* "0-3" or "0+2+5" (commas separate keys, so the list uses '+'). */
static int parse_cpus(mbp_opts *o, const char *v, size_t len)
{
	uint32_t n = 0;
	size_t i = 0;
	while (i < len) {
		size_t j = i;
		while (j < len && v[j] != '+')
			j++;
		const char *dash = memchr(v + i, '-', j - i);
		uint64_t lo, hi;
		int rc =
		    parse_u64_span(v + i, (size_t)((dash ? dash : v + j) - (v + i)), CPU_SETSIZE - 1, &lo);
		if (rc)
			return rc;
		hi = lo;
		if (dash && (rc = parse_u64_span(dash + 1, (size_t)(v + j - dash - 1), CPU_SETSIZE - 1, &hi)))
			return rc;
		if (hi < lo)
			return -EINVAL;
		for (uint64_t c = lo; c <= hi; c++) {
			if (n == MBP_MAX_CPUS)
				return -E2BIG;
			o->cpus[n++] = (int)c;
		}
		i = j + 1;
	}
	if (n == 0)
		return -EINVAL;
	o->ncpus = n;
	return 0;
}

int mbp_opts_parse(mbp_opts *o, const char *conf, size_t *errpos)
{
	if (!o)
		return -EINVAL;
	if (!conf)
		return 0;
	const char *p = conf;
	while (*p) {
		const char *end = strchr(p, ',');
		if (!end)
			end = p + strlen(p);
		const char *eq = memchr(p, '=', (size_t)(end - p));
		int rc = -EINVAL;
		if (eq) {
			size_t klen = (size_t)(eq - p), vlen = (size_t)(end - eq - 1);
			const char *v = eq + 1;
			uint64_t x = 0;
#define KEY(name) (klen == sizeof(name) - 1 && memcmp(p, name, klen) == 0)
			if (KEY("cpus"))
				rc = parse_cpus(o, v, vlen);
			else if ((rc = parse_u64_span(v, vlen, UINT32_MAX, &x)) != 0)
				;
			else if (KEY("row_bytes"))
				o->in_row_bytes = x;
			else if (KEY("max_mb_rows"))
				o->max_mb_rows = (uint32_t)x;
			else if (KEY("ring"))
				o->ring_capacity = (uint32_t)x;
			else if (KEY("ingress"))
				o->ingress_depth = (uint32_t)x;
			else if (KEY("mb_buffers"))
				o->mb_buffers = (uint32_t)x;
			else if (KEY("pool_mb"))
				o->pool_bytes = (size_t)x << 20;
			else if (KEY("cache"))
				o->cache_size = (uint32_t)x;
			else if (KEY("spin_us"))
				o->spin_ns = x ? x * 1000 : MBP_SPIN_NONE;
			else if (KEY("yield_us"))
				o->yield_ns = x ? x * 1000 : MBP_YIELD_NONE;
			else if (KEY("pin") && x <= 1)
				o->pinning = x ? MBP_PIN_PLAN : MBP_PIN_NONE;
			else if (KEY("threads"))
				o->threads = (uint32_t)x;
			else if (KEY("trace"))
				o->trace_events = (uint32_t)x;
			else
				rc = -EINVAL;
#undef KEY
			/* the key's rule, where the value is given rather than at mbp_pipeline_new */
			const struct rule *r = rule_of(p, klen);
			if (rc == 0 && (!r || !r->ok(o) || (r->zero_is_default && x == 0)))
				rc = -EINVAL;
		}
		if (rc) {
			if (errpos)
				*errpos = (size_t)(p - conf);
			return rc;
		}
		p = *end ? end + 1 : end;
	}
	return 0;
}
