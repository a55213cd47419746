#!/bin/sh
# DESIGN.md rule 7: every atomic access of the pipeline's lifecycle word (`state`) and of its submitter
# count (`submitting`) names its memory order (an _explicit call) and, in the comment just above it or on
# its line, its partner ("partner") or why no partner is needed ("relaxed:", "seq_cst").
# Usage: tests/atomic_partners.sh [FILE...] (default: the files that touch them); run by `make check`.
set -eu
src=${srcdir:-$(dirname "$0")/..}
[ $# -gt 0 ] || set -- "$src/lib/pipeline.c"
status=0
for f in "$@"; do
	awk -v file="$f" '
		{ line[NR] = $0 }
		/atomic_[a-z_]*\(&p->(state|submitting)[,)]/ && !/atomic_init/ {
			if ($0 !~ /_explicit\(/) {
				printf "%s:%d: atomic access without a named memory order: %s\n", file, NR, $0
				bad = 1
				next
			}
			ok = 0
			for (i = NR; i >= NR - 6 && i > 0; i--)
				if (line[i] ~ /partner|relaxed:|seq_cst/) { ok = 1; break }
			if (!ok) {
				printf "%s:%d: atomic access whose comment names no partner: %s\n", file, NR, $0
				bad = 1
			}
		}
		END { exit bad }' "$f" || status=1
done
exit $status
