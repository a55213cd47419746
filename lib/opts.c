/* opts: in progress */
#include "config.h"
