/* stats: in progress */
#include "config.h"
