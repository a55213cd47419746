/* Error text for mbpipe's negative errno codes, generated from MBP_ERRNO_MAP. */
#include "config.h"

#include <mbpipe.h>

#include "common.h"

const char *mbp_strerror(int err)
{
	if (err > 0)
		err = -err;
	switch (err) {
	case 0:
		return "success";
#define MBP__ERR_TEXT(name, text)                                                                            \
	case -(name):                                                                                        \
		return text;
		MBP_ERRNO_MAP(MBP__ERR_TEXT)
#undef MBP__ERR_TEXT
	}
	return "unknown error";
}

const char *mbp_err_name(int err)
{
	if (err > 0)
		err = -err;
	switch (err) {
	case 0:
		return "OK";
#define MBP__ERR_NAME(name, text)                                                                            \
	case -(name):                                                                                        \
		return #name;
		MBP_ERRNO_MAP(MBP__ERR_NAME)
#undef MBP__ERR_NAME
	}
	return "UNKNOWN";
}

const char *mbp_version(void)
{
	return MBP_VERSION_STRING;
}

unsigned mbp_version_hex(void)
{
	return MBP_VERSION_HEX;
}

/* MBP_VERIFY's failure path (lib/common.h): an invariant broke and data would be corrupted or lost, so
 * report where and stop at once rather than run on. */
void mbp__verify_failed(const char *expr, const char *file, int line, const char *func)
{
	fprintf(stderr, "mbpipe: %s:%d: %s: invariant failed: %s\n", file, line, func, expr);
	fflush(stderr);
	abort();
}
