/*
 * The tools' one note on a model file that carries no digests (not written by mbpipe: its weights load,
 * but cannot be checked for corruption), in the same words wherever a tool loads one: pipetrain's
 * --model, pipeserve's --model, its --describe and a live reload. Header-only, public API only.
 */
#ifndef MBP_UTIL_DIGEST_H
#define MBP_UTIL_DIGEST_H

#include <stdbool.h>
#include <stdio.h>

#include <mbpipe.h>

/* "NAME has no digest (not written by mbpipe): its weights cannot be checked for corruption" into buf
 * (no prefix, no newline; NAME as the user knows the file: a path, "--model PATH"); false (buf untouched)
 * when m's load checked every tensor against its digest. */
static inline bool digest_note_line(const mbp_model *m, const char *name, char *buf, size_t n)
{
	if (mbp_model_verified(m))
		return false;
	snprintf(buf, n,
		 "%s has no digest (not written by mbpipe): its weights cannot be checked for corruption",
		 name);
	return true;
}

#endif
