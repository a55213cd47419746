/*
 * Seed corpus for fuzz_safetensors: a few valid model files (F32, F16, BF16, with and without norms) and
 * small hand-made headers covering the format's corners. Usage: st_seeds DIR
 */
#include "config.h"

#include <endian.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <mbpipe.h>

static int raw(const char *dir, const char *name, const char *header, size_t data_len)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	uint64_t n = htole64(strlen(header));
	fwrite(&n, 8, 1, f);
	fputs(header, f);
	for (size_t i = 0; i < data_len; i++)
		fputc((int)(i * 37 & 0xff), f);
	return fclose(f);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return 2;
	}
	const char *dir = argv[1];
	char path[512];
	static const struct {
		unsigned layers, in, hidden, out;
		mbp_act act;
		bool norm;
		mbp_dtype dtype;
	} models[] = {
	    {1, 2, 2, 2, MBP_ACT_NONE, false, MBP_DTYPE_F32},
	    {2, 3, 4, 2, MBP_ACT_RELU, true, MBP_DTYPE_F16},
	    {3, 2, 3, 1, MBP_ACT_GELU, true, MBP_DTYPE_BF16},
	    {2, 1, 1, 1, MBP_ACT_RELU, false, MBP_DTYPE_F32},
	};
	for (unsigned i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
		mbp_model_spec sp = {.layers = models[i].layers,
				     .in = models[i].in,
				     .hidden = models[i].hidden,
				     .out = models[i].out,
				     .act = models[i].act,
				     .norm = models[i].norm,
				     .dtype = models[i].dtype,
				     .seed = i};
		snprintf(path, sizeof(path), "%s/model%u.safetensors", dir, i);
		int rc = mbp_model_write_random(path, &sp);
		if (rc) {
			fprintf(stderr, "%s: %s\n", path, mbp_strerror(rc));
			return 1;
		}
	}
	int bad = 0;
	bad |= raw(dir, "empty", "{}", 0);
	bad |= raw(dir, "meta-null", "{\"__metadata__\":null}       ", 0);
	bad |= raw(dir, "zero-size",
		   "{\"a\":{\"dtype\":\"BOOL\",\"shape\":[0],\"data_offsets\":[0,0]},"
		   "\"b\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}",
		   8);
	bad |= raw(dir, "dtypes",
		   "{\"__metadata__\":{\"k\":\"v\\u00e9\\n\"},"
		   "\"x\":{\"dtype\":\"F8_E5M2\",\"shape\":[2,1],\"data_offsets\":[0,2]},"
		   "\"y\":{\"dtype\":\"U16\",\"shape\":[1],\"data_offsets\":[2,4]},"
		   "\"z\":{\"dtype\":\"I64\",\"shape\":[1,1,1],\"data_offsets\":[4,12]}}",
		   12);
	bad |= raw(dir, "numbers", "{\"n\":[-0.5e+3,1E9,0,true,false,null,{}]}", 0);
	if (bad) {
		perror("seed");
		return 1;
	}
	return 0;
}
