#!/usr/bin/env bash
# Build and run every test: install what is missing, build with -Werror, `make check`, the model suites
# again with MBP_KERNEL=blas, `make check-mpi`,
# then check the installed library as a user meets it (every example compiled against a prefixed and a
# DESTDIR install through pkg-config, and run: scripts/check-install.sh), and run every command of the
# README (scripts/check-readme.sh).
#   scripts/test.sh            the test suite (what the README's test command runs)
#   scripts/test.sh --tsan     the concurrency tests under ThreadSanitizer (shrunk iteration counts)
#   scripts/test.sh --asan     the whole suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   scripts/test.sh --debug    the pool, ring, pipeline and trainer suites with asserts and poisoning on
#   scripts/test.sh --fuzz     short fixed-length libFuzzer runs of the parsers
#   scripts/test.sh --format   the clang-format check
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-default}
"$top/scripts/deps.sh"

case "$mode" in
default)
	b="$top/build-check"
	"$top/scripts/build.sh" "$b" --enable-werror
	make -C "$b" -j"$(nproc)" check
	# the suites that compute through the dense layers again on OpenBLAS (a few seconds): the default is
	# the packed kernel on CPUs with AVX2 and FMA, and OpenBLAS's path must keep its coverage there
	MBP_KERNEL=blas make -C "$b" -j"$(nproc)" check \
		TESTS="tests/test_model tests/test_mlp tests/test_model_replicas"
	# the pipeline across MPI ranks, under mpirun with 2 and 4 ranks (tests/mpi.sh)
	make -C "$b" check-mpi
	# the installed library: both .pc files after a prefixed and a DESTDIR install, and every example of
	# examples/ compiled against each install through pkg-config and run (scripts/check-install.sh)
	"$top/scripts/check-install.sh" "$b"
	# every command of the README, as written
	"$top/scripts/check-readme.sh" "$b"
	;;
--tsan)
	b="$top/build-tsan"
	"$top/scripts/build.sh" "$b" --enable-tsan --enable-werror
	MBP_TEST_SCALE=${MBP_TEST_SCALE:-10} CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-4} \
		TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
		make -C "$b" -j"$(nproc)" check-concurrency
	;;
--asan)
	b="$top/build-asan"
	"$top/scripts/build.sh" "$b" --enable-asan --enable-werror
	MBP_TEST_SCALE=${MBP_TEST_SCALE:-4} CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-3} \
		make -C "$b" -j"$(nproc)" check
	# the MPI tests too; Open MPI's own allocations are never freed, so leak detection is off for them
	ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} make -C "$b" check-mpi
	;;
--debug)
	# asserts and the pool's poisoning on (--enable-debug, -O0): the checks that the other builds skip
	# (test_pool's write after release), and the suites of the structures they guard
	b="$top/build-debug"
	"$top/scripts/build.sh" "$b" --enable-debug --enable-werror
	make -C "$b" -j"$(nproc)" check TESTS="tests/test_pool tests/test_ring tests/test_pipeline tests/test_train"
	;;
--fuzz)
	b="$top/build-check"
	"$top/scripts/build.sh" "$b" --enable-werror
	make -C "$b" fuzz
	;;
--format)
	b="$top/build-check"
	"$top/scripts/build.sh" "$b" --enable-werror
	make -C "$b" format-check
	;;
*)
	echo "test.sh: unknown mode '$mode' (default, --tsan, --asan, --debug, --fuzz, --format)" >&2
	exit 2
	;;
esac
