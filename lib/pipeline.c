/* pipeline: in progress */
#include "config.h"
