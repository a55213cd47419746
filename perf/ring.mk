# perf ring: mbpipe's SPSC ring against a plain C11 ring, ck_ring, boost::lockfree::spsc_queue and moodycamel's
# queues (perf/results/ring.md). The C part (mbpipe, C11, ck) and the C++ part (the peers) both get -O2 here;
# configure's default CFLAGS and CXXFLAGS (-g -O2) come after it and agree. Keep the two alike if you set them.
if HAVE_PERF_PEERS
EXTRA_PROGRAMS += perf/bench_ring
PERF_BINS += perf/bench_ring
perf_bench_ring_SOURCES = perf/bench_ring.c perf/bench_ring.h perf/bench_ring_peers.cc
perf_bench_ring_CFLAGS = $(AM_CFLAGS) -O2
perf_bench_ring_CXXFLAGS = $(AM_CXXFLAGS) -O2
perf_bench_ring_LDADD = $(MBP_LIBS) -lck
endif
