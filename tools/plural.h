/*
 * Singular or plural by count, for the tools' messages: printf("%u %s", n, PLURAL(n, "row", "rows")).
 * Header-only; shared by pipebench and pipeserve.
 */
#ifndef MBP_TOOLS_PLURAL_H
#define MBP_TOOLS_PLURAL_H

#define PLURAL(n, one, many) ((n) == 1 ? (one) : (many))

#endif
