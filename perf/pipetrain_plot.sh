#!/bin/sh
# Draw pipetrain's per-epoch CSV (--csv) as an SVG: training loss and test accuracy by epoch, side by side.
# No plotting library: awk writes the SVG. Usage: perf/pipetrain_plot.sh RUN.csv [TITLE] > curves.svg
set -eu
csv=${1:?usage: pipetrain_plot.sh RUN.csv [TITLE]}
title=${2:-pipetrain}
awk -F, -v title="$title" '
NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
{
	n++; ep[n] = $col["epoch"]; loss[n] = $col["train_loss"]; acc[n] = $col["test_acc"]; val[n] = $col["val_acc"]
	if (loss[n] > lmax) lmax = loss[n]
}
function px(i, x0) { return x0 + 50 + (n > 1 ? (i - 1) * 300 / (n - 1) : 150) }
function panel(x0, name, lo, hi, unit,   i, y, k, t) {
	printf "<rect x=\"%d\" y=\"40\" width=\"300\" height=\"200\" transform=\"translate(50,0)\" fill=\"none\" stroke=\"#888\"/>\n", x0
	printf "<text x=\"%d\" y=\"30\" font-size=\"14\">%s</text>\n", x0 + 50, name
	for (k = 0; k <= 4; k++) {
		t = lo + (hi - lo) * k / 4; y = 240 - 200 * k / 4
		printf "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"end\">%.3f</text>\n", x0 + 46, y + 3, t
		printf "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#eee\"/>\n", x0 + 50, x0 + 350, y, y
	}
	for (i = 1; i <= n; i++)
		printf "<text x=\"%.1f\" y=\"255\" font-size=\"10\" text-anchor=\"middle\">%d</text>\n", px(i, x0), ep[i]
	printf "<text x=\"%d\" y=\"272\" font-size=\"11\" text-anchor=\"middle\">epoch</text>\n", x0 + 200
}
function line(x0, arr, lo, hi, color, label, ly,   i, s) {
	s = ""
	for (i = 1; i <= n; i++) s = s sprintf("%s%.1f,%.1f", i > 1 ? " " : "", px(i, x0), 240 - 200 * (arr[i] - lo) / (hi - lo))
	printf "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n", s, color
	for (i = 1; i <= n; i++) printf "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", px(i, x0), 240 - 200 * (arr[i] - lo) / (hi - lo), color
	printf "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"%s\">%s</text>\n", x0 + 240, ly, color, label
}
END {
	if (n == 0) { print "pipetrain_plot: no rows" > "/dev/stderr"; exit 1 }
	amin = 1; for (i = 1; i <= n; i++) { if (acc[i] < amin) amin = acc[i]; if (val[i] < amin) amin = val[i] }
	amin = int(amin * 50) / 50; if (amin > 0.86) amin = 0.86
	printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"820\" height=\"300\" font-family=\"sans-serif\">\n"
	printf "<rect width=\"820\" height=\"300\" fill=\"white\"/>\n"
	printf "<text x=\"410\" y=\"16\" font-size=\"13\" text-anchor=\"middle\">%s</text>\n", title
	panel(0, "training loss (mean over the epoch)", 0, lmax * 1.05)
	line(0, loss, 0, lmax * 1.05, "#c0392b", "train loss", 60)
	panel(410, "accuracy", amin, 1)
	# the target
	y = 240 - 200 * (0.89 - amin) / (1 - amin)
	printf "<line x1=\"460\" x2=\"760\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" stroke-dasharray=\"4,3\"/>\n", y, y
	printf "<text x=\"465\" y=\"%.1f\" font-size=\"10\" fill=\"#666\">0.89 target</text>\n", y - 3
	line(410, acc, amin, 1, "#2c6fbb", "test accuracy", 60)
	line(410, val, amin, 1, "#27ae60", "validation", 74)
	print "</svg>"
}' "$csv"
