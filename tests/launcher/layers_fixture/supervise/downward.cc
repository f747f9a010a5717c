// A supervise source using an earlier stage: allowed.
#include "launcher/plan/plan.h"
#include "launcher/options.h"
