/* trace: in progress */
#include "config.h"
