/*
 * Which OpenBLAS runs, and a warning when it picked a generic kernel on a CPU that can do much better.
 *
 * OpenBLAS with DYNAMIC_ARCH chooses its kernels at load time from the CPU model. Debian's 0.3.21 does
 * not know recent CPUs and falls back to "Prescott" (SSE3), about 3 times slower than its AVX-512 or AVX2
 * kernels. Which kernel to force is the user's decision (OPENBLAS_CORETYPE, read when the library loads);
 * mbpipe reports and warns, and never sets it.
 */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <cblas.h>

#include <mbpipe.h>

#include "common.h"
#include "model_internal.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char info[320];
static char warning[400];
static bool warn;

/* OpenBLAS core names whose kernels use AVX2 or AVX-512. */
static bool kernel_is_modern(const char *core)
{
	static const char *const modern[] = {"Haswell",	       "Zen",	   "SkylakeX", "CooperLake",
					     "SapphireRapids", "Excavator"};
	for (size_t i = 0; i < sizeof(modern) / sizeof(modern[0]); i++)
		if (!strcasecmp(core, modern[i]))
			return true;
	return false;
}

static void probe(void)
{
	const char *core = openblas_get_corename();
	const char *config = openblas_get_config();
	core = core ? core : "unknown";
	config = config ? config : "?";
	/* What the stages use, not the process's count at this moment (which is OpenBLAS's default until a
	 * stage starts, and differed from tool to tool): every stage sets MBP__BLAS_THREADS_PER_STAGE. */
	snprintf(info, sizeof(info), "%s%s, kernel %s; stages use %d BLAS %s each",
		 strncmp(config, "OpenBLAS", 8) ? "OpenBLAS " : "", config, core, MBP__BLAS_THREADS_PER_STAGE,
		 PLURAL(MBP__BLAS_THREADS_PER_STAGE, "thread", "threads"));
	__builtin_cpu_init();
	bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
	if (!kernel_is_modern(core) && (avx512 || avx2)) {
		warn = true;
		snprintf(
		    warning, sizeof(warning),
		    "OpenBLAS picked the generic '%s' kernel on a CPU with %s: matrix products run about 3x "
		    "slower than they could. To choose the kernel, export OPENBLAS_CORETYPE=%s before the "
		    "process starts (mbpipe never sets it).",
		    core, avx512 ? "AVX-512" : "AVX2", avx512 ? "SkylakeX" : "Haswell");
	}
}

const char *mbp_blas_info(void)
{
	pthread_once(&once, probe);
	return info;
}

const char *mbp_blas_warning(void)
{
	pthread_once(&once, probe);
	return warn ? warning : NULL;
}

/* One BLAS thread per stage. The pipeline owns the cores: each worker thread is pinned to its own CPU and
 * computes its stages' layers there; OpenBLAS's own worker threads would run on the same CPUs and fight the
 * other stages for them (and its threaded sgemm on a small micro-batch mostly waits on them). The setting is
 * process-wide, so every stage's init applies it, under a lock because it is not safe to call from several
 * threads at once. */
static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;

void mbp__blas_one_thread(void)
{
	pthread_mutex_lock(&blas_lock);
	if (openblas_get_num_threads() != 1)
		openblas_set_num_threads(1);
	pthread_mutex_unlock(&blas_lock);
}
