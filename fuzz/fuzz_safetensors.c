/*
 * libFuzzer target for the safetensors reader (lib/model/safetensors.c): any byte string is a candidate
 * file image. Built with clang -fsanitize=fuzzer,address,undefined by `make fuzz-safetensors`, which runs a
 * fixed number of executions from a generated seed corpus (fuzz/st_seeds.c).
 *
 * Beyond "no crash, no sanitizer report", it checks the reader's contract: an accepted file's tensors tile
 * the data section exactly and are found by name; a rejected one has a rule, a matching errno and a
 * one-line message that, for an input that is not a safetensors file, is the rule's words alone; and it
 * leaves nothing allocated (ASan's leak check).
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

#define CHECK(x)                                                                                             \
	do {                                                                                                 \
		if (!(x))                                                                                    \
			abort();                                                                             \
	} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	mbp__st st;
	mbp_model_error err;
	int rc = mbp__st_parse(data, size, &st, &err);
	if (rc) {
		CHECK(rc < 0 && err.code == rc && err.rule != MBP_LOAD_OK);
		CHECK(rc == mbp__load_rule_errno(err.rule));
		CHECK(memchr(err.msg, 0, sizeof(err.msg)) && err.msg[0]);
		/* before the header is a JSON object: the rule's words only, nothing of the input */
		if (err.rule >= MBP_ST_HEADER_TOO_SMALL && err.rule <= MBP_ST_HEADER_JSON)
			CHECK(!strncmp(err.msg, mbp_load_rule_str(err.rule),
				       strlen(mbp_load_rule_str(err.rule))) &&
			      err.tensor[0] == 0);
		for (const char *c = err.msg; *c; c++)
			CHECK((unsigned char)*c >= 0x20 && *c != 0x7f); /* one printable line */
		CHECK(st.n == 0 && st.t == NULL);
		return 0;
	}
	uint64_t total = 0;
	for (size_t i = 0; i < st.n; i++) {
		const mbp__st_tensor *t = &st.t[i];
		CHECK(t->begin <= t->end && t->end <= st.data_len);
		CHECK(t->end - t->begin == t->nelem * mbp__st_dtype_size(t->dtype));
		CHECK(mbp__st_find(&st, t->name) == t);
		total += t->end - t->begin;
		/* touch the bytes: they must lie inside the input */
		if (t->dtype == MBP__ST_F16 || t->dtype == MBP__ST_BF16)
			for (uint64_t e = 0; e < t->nelem && e < 64; e++) {
				uint16_t h;
				memcpy(&h, st.data + t->begin + 2 * e, 2);
				volatile float f =
				    t->dtype == MBP__ST_F16 ? mbp__f16_to_f32(h) : mbp__bf16_to_f32(h);
				(void)f;
			}
	}
	CHECK(total == st.data_len); /* tiles it: no gap, no overlap, nothing after */
	CHECK(st.data + st.data_len == data + size);
	mbp__st_free(&st);
	return 0;
}
