#!/bin/sh
# ARCHITECTURE.md rule 5, for every atomic access of the library: each names its memory order (an _explicit call,
# or a fence with its order) and says, in a comment on its lines or in the 6 lines above them, why that
# order: an acquire, release, acq_rel or consume names its partner ("partner"), a relaxed one why relaxed
# is enough ("relaxed"), a seq_cst one what it pairs with ("seq_cst"). atomic_init is exempt.
# Usage: tests/atomic_partners.sh [FILE...] (default: every file of lib/ and lib/mpi/ that uses atomics);
# run by `make check`.
set -eu
src=${srcdir:-$(dirname "$0")/..}
if [ $# -eq 0 ]; then
	# shellcheck disable=SC2046 # one word per file name (no spaces in the tree's names)
	set -- $(grep -l 'atomic_[a-z_]*(' "$src"/lib/*.[ch] "$src"/lib/mpi/*.[ch])
fi
status=0
for f in "$@"; do
	awk -v file="$f" '
		# Split each line into its code and its comment text (block comments span lines).
		{
			rest = $0; code = ""; com = ""
			while (rest != "") {
				if (incom) {
					e = index(rest, "*/")
					if (e == 0) { com = com " " rest; rest = "" }
					else { com = com " " substr(rest, 1, e - 1); rest = substr(rest, e + 2); incom = 0 }
				} else {
					b = index(rest, "/*"); l = index(rest, "//")
					if (l && (b == 0 || l < b)) { code = code substr(rest, 1, l - 1); com = com " " substr(rest, l + 2); rest = "" }
					else if (b) { code = code substr(rest, 1, b - 1); rest = substr(rest, b + 2); incom = 1 }
					else { code = code rest; rest = "" }
				}
			}
			codes[NR] = code; coms[NR] = com; text[NR] = $0
		}
		END {
			for (n = 1; n <= NR; n++) {
				c = codes[n]
				if (c !~ /atomic_[a-z_]+[ \t]*\(/ || c ~ /atomic_init[ \t]*\(/ && c !~ /atomic_(load|store|exchange|fetch|compare|thread|signal)/)
					continue
				# the statement: this line and the next ones until its parentheses close (5 at most)
				stmt = c; depth = gsub(/\(/, "(", c) - gsub(/\)/, ")", c); last = n
				while (depth > 0 && last < n + 5 && last < NR) {
					last++; stmt = stmt " " codes[last]
					t = codes[last]; depth += gsub(/\(/, "(", t) - gsub(/\)/, ")", t)
				}
				s = stmt
				gsub(/atomic_init[ \t]*\(/, "", s)
				if (s ~ /atomic_(load|store|exchange|fetch_[a-z]+|compare_exchange_(weak|strong))[ \t]*\(/) {
					printf "%s:%d: atomic access without a named memory order: %s\n", file, n, text[n]
					bad = 1
					continue
				}
				why = ""
				for (i = n - 6; i <= last; i++)
					if (i > 0) why = why " " coms[i]
				if (s ~ /memory_order_(acquire|release|acq_rel|consume)/ && why !~ /partner/) {
					printf "%s:%d: acquire/release whose comment names no partner: %s\n", file, n, text[n]
					bad = 1
				}
				if (s ~ /memory_order_relaxed/ && why !~ /relaxed/) {
					printf "%s:%d: relaxed access whose comment says not why: %s\n", file, n, text[n]
					bad = 1
				}
				if (s ~ /memory_order_seq_cst/ && why !~ /seq_cst/) {
					printf "%s:%d: seq_cst access whose comment names not its pair: %s\n", file, n, text[n]
					bad = 1
				}
			}
			exit bad
		}' "$f" || status=1
done
exit $status
