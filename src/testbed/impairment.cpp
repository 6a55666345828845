// Placeholder: packet loss injection on testbed links.
#include "impairment.h"
