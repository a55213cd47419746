#!/usr/bin/env bash
# Build and run every test: install what is missing, build with -Werror, `make check`, then check that a
# program outside the tree links against the library installed to a prefix through pkg-config, and run
# every command of the README (scripts/check-readme.sh).
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
	# Link an outside program against the installed library, as a user would: installed to a prefix
	# (`make install prefix=DIR`, what the README shows), found by pkg-config through PKG_CONFIG_PATH
	# alone; then staged with DESTDIR (the .pc names the final prefix) and relocated with
	# --define-variable, as a packager would.
	inst=$(mktemp -d)
	make -C "$b" install prefix="$inst/pfx" >/dev/null
	# shellcheck disable=SC2046 # word splitting of pkg-config's flags is intended
	cc -o "$inst/hello" "$top/examples/hello.c" \
		$(PKG_CONFIG_PATH="$inst/pfx/lib/pkgconfig" pkg-config --static --cflags --libs mbpipe)
	"$inst/hello"
	make -C "$b" install DESTDIR="$inst/stage" prefix=/opt/mbpipe >/dev/null
	grep -qx 'prefix=/opt/mbpipe' "$inst/stage/opt/mbpipe/lib/pkgconfig/mbpipe.pc"
	pc="pkg-config --define-variable=prefix=$inst/stage/opt/mbpipe --static"
	# shellcheck disable=SC2046
	cc -o "$inst/hello2" "$top/examples/hello.c" \
		$(PKG_CONFIG_PATH="$inst/stage/opt/mbpipe/lib/pkgconfig" $pc --cflags --libs mbpipe)
	"$inst/hello2"
	# the same for the library across MPI ranks, run with 2 ranks
	if $pc --exists mbpipe-mpi; then
		# shellcheck disable=SC2046
		cc -o "$inst/hello_mpi" "$top/examples/hello_mpi.c" $($pc --cflags --libs mbpipe-mpi) -lm
		OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
			mpirun --oversubscribe -np 2 "$inst/hello_mpi"
	fi
	rm -rf "$inst"
	make -C "$b" mbpipe.pc >/dev/null # back to the configured prefix
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
