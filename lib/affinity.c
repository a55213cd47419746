/* affinity: in progress */
#include "config.h"
