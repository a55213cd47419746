#!/usr/bin/env bash
# The installed library as a user and a packager meet it:  scripts/check-install.sh BUILD_DIR
# (scripts/test.sh runs it after `make check`). Installs BUILD_DIR twice, to a prefix (`make install
# prefix=DIR`, what the README shows) and staged with DESTDIR (the .pc files name the final prefix, and
# --define-variable relocates them, as a packager would); checks that every .pc file names its install's
# prefix and leads to that install's library; then compiles every example of examples/ against each
# install, through pkg-config alone, and runs it (one that includes <mbpipe/mpi.h> with mbpipe-mpi,
# under mpirun with 2 ranks). What the build was configured with decides what must run: where configure
# found MPI, an MPI example that cannot be built or run fails this script instead of being skipped.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
b=$(cd "${1:?usage: scripts/check-install.sh BUILD_DIR}" && pwd)
fail() {
	echo "check-install: $*" >&2
	exit 1
}
# What configure found, from the build's own Makefile (the substituted variables).
mk() { sed -n "s/^$1 = //p" "$b/Makefile"; }
mpi_pc=$(mk MBP_PC_MPI)
mpirun=$(mk MPIRUN)
mods=mbpipe
if [ -n "$mpi_pc" ]; then
	mods="mbpipe mbpipe-mpi"
	[ -n "$mpirun" ] || fail "configure found MPI ($mpi_pc) but no mpirun: the MPI examples cannot run"
fi
mods_pc() { for m in $mods; do printf '%s.pc ' "$m"; done; }
inst=$(mktemp -d)
# back to the configured prefix afterwards: an install rewrites the build's .pc files
trap 'rm -rf "$inst"; make -s -C "$b" $(mods_pc) >/dev/null 2>&1 || true' EXIT

# PCDIR PREFIX LIBDIR ROOT PKG-CONFIG...: every .pc in PCDIR says prefix=PREFIX and, read through
# PKG-CONFIG, gives LIBDIR, where its library is (below ROOT: the DESTDIR of a staged install).
check_pc() {
	local dir=$1 prefix=$2 libdir=$3 root=$4 m got
	shift 4
	for m in $mods; do
		[ -f "$dir/$m.pc" ] || fail "$dir/$m.pc: not installed"
		grep -qx "prefix=$prefix" "$dir/$m.pc" ||
			fail "$dir/$m.pc names $(grep '^prefix=' "$dir/$m.pc"), not prefix=$prefix"
		got=$(PKG_CONFIG_PATH="$dir" "$@" --variable=libdir "$m")
		[ "$got" = "$libdir" ] || fail "$m.pc: libdir is $got, not $libdir"
		[ -f "$root$libdir/lib$m.a" ] || fail "$m.pc: $root$libdir/lib$m.a does not exist"
	done
	echo "check-install: $(mods_pc)in $dir: prefix=$prefix, libraries in $libdir"
}

# TAG PCDIR PKG-CONFIG...: compile every example against the install PKG-CONFIG finds in PCDIR, run it.
examples() {
	local tag=$1 dir=$2 src name mod flags
	shift 2
	for src in "$top"/examples/*.c; do
		name=$(basename "$src" .c)
		mod=mbpipe
		if grep -q '<mbpipe/mpi.h>' "$src"; then
			if [ -z "$mpi_pc" ]; then
				echo "check-install: $name: not built (configure found no MPI)"
				continue
			fi
			mod=mbpipe-mpi
		fi
		flags=$(PKG_CONFIG_PATH="$dir" "$@" --static --cflags --libs "$mod") ||
			fail "$name: pkg-config $mod failed"
		# shellcheck disable=SC2086 # word splitting of pkg-config's flags is intended
		cc -Wall -Werror -o "$inst/$tag-$name" "$src" $flags -lm || fail "$name ($tag): does not compile"
		if [ "$mod" = mbpipe-mpi ]; then
			OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp \
				OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo \
				timeout 120 "$mpirun" --oversubscribe -np 2 "$inst/$tag-$name" ||
				fail "$name ($tag): failed under mpirun -np 2"
		else
			timeout 120 "$inst/$tag-$name" || fail "$name ($tag): failed"
		fi
	done
}

# 1. To a prefix, found through PKG_CONFIG_PATH alone.
make -C "$b" install prefix="$inst/pfx" >/dev/null
check_pc "$inst/pfx/lib/pkgconfig" "$inst/pfx" "$inst/pfx/lib" "" pkg-config
examples pfx "$inst/pfx/lib/pkgconfig" pkg-config
# 2. Staged with DESTDIR for /opt/mbpipe, relocated with --define-variable.
make -C "$b" install DESTDIR="$inst/stage" prefix=/opt/mbpipe >/dev/null
dir="$inst/stage/opt/mbpipe/lib/pkgconfig"
check_pc "$dir" /opt/mbpipe /opt/mbpipe/lib "$inst/stage" pkg-config
reloc="$inst/stage/opt/mbpipe"
check_pc "$dir" /opt/mbpipe "$reloc/lib" "" pkg-config --define-variable=prefix="$reloc"
examples stage "$dir" pkg-config --define-variable=prefix="$reloc"
echo "check-install: ok ($(mods_pc)after a prefixed and a DESTDIR install; every example compiled and ran)"
