#!/usr/bin/env bash
# Build and run every test: install what is missing, build with -Werror, `make check`, then check that a
# program outside the tree links against the installed library through pkg-config.
#   scripts/test.sh            the test suite (what the README's test command runs)
#   scripts/test.sh --tsan     the concurrency tests under ThreadSanitizer (shrunk iteration counts)
#   scripts/test.sh --asan     the whole suite under AddressSanitizer + UndefinedBehaviorSanitizer
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
	# the pipeline across MPI ranks, under mpirun with 2 and 4 ranks (tests/mpi.sh)
	make -C "$b" check-mpi
	# link an outside program against the installed library, as a user would
	inst=$(mktemp -d)
	make -C "$b" install DESTDIR="$inst" prefix=/usr/local >/dev/null
	pc="pkg-config --define-variable=prefix=$inst/usr/local --static"
	export PKG_CONFIG_PATH="$inst/usr/local/lib/pkgconfig"
	# shellcheck disable=SC2046 # word splitting of pkg-config's flags is intended
	cc -o "$inst/hello" "$top/examples/hello.c" $($pc --cflags --libs mbpipe)
	"$inst/hello"
	# the same for the library across MPI ranks, run with 2 ranks
	if $pc --exists mbpipe-mpi; then
		# shellcheck disable=SC2046
		cc -o "$inst/hello_mpi" "$top/examples/hello_mpi.c" $($pc --cflags --libs mbpipe-mpi) -lm
		OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
			mpirun --oversubscribe -np 2 "$inst/hello_mpi"
	fi
	rm -rf "$inst"
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
	echo "test.sh: unknown mode '$mode' (default, --tsan, --asan, --fuzz, --format)" >&2
	exit 2
	;;
esac
