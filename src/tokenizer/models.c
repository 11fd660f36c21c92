/* placeholder */
#include "components.h"
