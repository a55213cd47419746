/* worker: in progress */
#include "config.h"
