// Placeholder: per-link bandwidth shaping in the testbed.
#include "shaping.h"
