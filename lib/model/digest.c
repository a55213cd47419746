/*
 * The digests mbpipe writes into every safetensors file it makes (lib/model/write.c), and their check when
 * a file is read (lib/model/model.c, lib/model/checkpoint.c).
 *
 * What they cover. Each tensor's bytes as they are stored in the data section (its dtype, little-endian):
 * their CRC-32 (zlib's crc32_z, the polynomial of zlib, gzip and PNG) as 8 lowercase hexadecimal digits
 * under the metadata key "<tensor name>.crc32". One per tensor rather than one per file, so that a reader
 * of some layers only (mbp_model_load_layers, one MPI rank's part) checks every byte it reads without
 * reading the others. The header itself is not covered: every rule of the format and of the model layout
 * checks it already, and a changed digest or shape makes its tensor fail.
 *
 * Why a CRC is enough. What it is for is corruption: a disk or a copy that changed bytes, a program that
 * wrote into the middle of the file, a hole where a truncated file was extended again. A 32-bit CRC finds
 * every burst of up to 32 bits and misses other damage with probability 2^-32 per tensor. It is no defence
 * against an adversary, who can write a matching CRC as easily as the bytes (that would take a keyed MAC,
 * and a key to manage): someone who can write the model file chooses the weights anyway.
 *
 * A file has a digest for every tensor or for none. A file written by another tool has none and loads (the
 * tools say so in a note); one where some tensors have a digest and others not, or where one is not 8
 * hexadecimal digits, has had its header edited, and is refused as a mismatch is (MBP_LOAD_DIGEST).
 */
#include "config.h"

#include <string.h>

#include <zlib.h>

#include "safetensors.h"

uint32_t mbp__crc32(uint32_t crc, const void *p, size_t n)
{
	return (uint32_t)crc32_z(crc, p, n);
}

static bool parse_hex8(const char *s, uint32_t *v)
{
	uint32_t x = 0;
	for (int i = 0; i < 8; i++) {
		char c = s[i];
		if (c >= '0' && c <= '9')
			x = x << 4 | (uint32_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			x = x << 4 | (uint32_t)(c - 'a' + 10);
		else
			return false;
	}
	*v = x;
	return s[8] == '\0';
}

int mbp__st_digests(mbp__st *st, mbp_model_error *err)
{
	const size_t kl = strlen(MBP__ST_DIGEST_KEY);
	int found = 0;
	for (size_t k = 0; k < st->nmeta; k++) {
		const char *key = st->meta[2 * k];
		size_t n = strlen(key);
		if (n <= kl || strcmp(key + n - kl, MBP__ST_DIGEST_KEY))
			continue;
		const mbp__st_tensor *found_t = mbp__st_find_n(st, key, n - kl);
		if (!found_t) /* a key of that shape for no tensor: other metadata, ignored as other keys are */
			continue;
		mbp__st_tensor *t = &st->t[found_t - st->t];
		if (!parse_hex8(st->meta[2 * k + 1], &t->digest))
			return mbp__load_fail(err, MBP_LOAD_DIGEST, t->name,
					      "its digest is not 8 hexadecimal digits");
		t->has_digest = true;
		found++;
	}
	for (size_t i = 0; found && i < st->n; i++)
		if (!st->t[i].has_digest)
			return mbp__load_fail(err, MBP_LOAD_DIGEST, st->t[i].name,
					      "no digest, while the file's other tensors have one");
	return found;
}

int mbp__st_verify(const mbp__st_tensor *t, const uint8_t *p, mbp_model_error *err)
{
	if (!t->has_digest)
		return 0;
	uint32_t c = mbp__crc32(0, p, (size_t)(t->end - t->begin));
	if (c == t->digest)
		return 0;
	return mbp__load_fail(
	    err, MBP_LOAD_DIGEST, t->name,
	    "its bytes have CRC-32 %08x, the file's digest is %08x: the file changed after it "
	    "was written",
	    c, t->digest);
}
