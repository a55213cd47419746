/*
 * Singular or plural by count, for messages: printf("%u %s", n, PLURAL(n, "row", "rows")). The one such
 * macro of the library's texts and the tools'. Header-only.
 */
#ifndef MBP_UTIL_PLURAL_H
#define MBP_UTIL_PLURAL_H

#define PLURAL(n, one, many) ((n) == 1 ? (one) : (many))

#endif
