/*
 * mbpipe error codes.
 *
 * Not for direct inclusion: include <mbpipe.h>, which states the error policy.
 *
 * One list (MBP_ERRNO_MAP) generates both the MBP_E* codes and mbp_strerror()'s text. Each code is the
 * negative of the system errno of the same name, so a caller may compare against -EINVAL as well.
 */
#ifndef MBPIPE_ERROR_H
#define MBPIPE_ERROR_H

#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

/* clang-format off */
#define MBP_ERRNO_MAP(XX)                                                                          \
	XX(EINVAL,    "invalid argument")                                                          \
	XX(ENOMEM,    "out of memory")                                                             \
	XX(EAGAIN,    "full or empty, try again")                                                  \
	XX(ETIMEDOUT, "timed out")                                                                 \
	XX(EPIPE,     "closed")                                                                    \
	XX(ECANCELED, "canceled")                                                                  \
	XX(ESHUTDOWN, "pipeline is shut down")                                                     \
	XX(EBUSY,     "busy: resources still in use")                                              \
	XX(EALREADY,  "already started")                                                           \
	XX(ENOTCONN,  "not started")                                                               \
	XX(ERANGE,    "value out of range")                                                        \
	XX(EOVERFLOW, "size overflow")                                                             \
	XX(E2BIG,     "too large")                                                                 \
	XX(ENOENT,    "not found")                                                                 \
	XX(EEXIST,    "already exists")                                                            \
	XX(EIO,       "input/output error")                                                        \
	XX(EBADMSG,   "malformed data")                                                            \
	XX(ENOTSUP,   "not supported")                                                             \
	XX(EPERM,     "operation not permitted")                                                   \
	XX(EACCES,    "permission denied")                                                         \
	XX(ENOSPC,    "no space left")                                                             \
	XX(EFAULT,    "bad address")                                                               \
	XX(EDOM,      "numerical error")                                                           \
	XX(EPROTO,    "protocol error")                                                            \
	XX(ENOTRECOVERABLE, "state not recoverable")
/* clang-format on */

enum mbp_errno {
#define MBP__ERR_ENUM(name, text) MBP_##name = -(name),
	MBP_ERRNO_MAP(MBP__ERR_ENUM)
#undef MBP__ERR_ENUM
};

/**
 * Text for an mbpipe error code.
 *
 * Accepts the negative codes that mbpipe returns (and, for convenience, positive errno values). Never returns
 * NULL: an unknown code yields "unknown error". The string is static; do not free it. Thread-safe.
 */
const char *mbp_strerror(int err);

/** Name of an error code ("EINVAL"), or "UNKNOWN". Thread-safe. */
const char *mbp_err_name(int err);

#ifdef __cplusplus
}
#endif
#endif
