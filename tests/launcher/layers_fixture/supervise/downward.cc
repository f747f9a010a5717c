// A supervise source using an earlier stage: allowed.
#include "launcher/options.h"
#include "launcher/plan/plan.h"
