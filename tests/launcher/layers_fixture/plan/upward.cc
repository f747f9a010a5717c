// A plan source that reaches up to the supervise stage: refused.
#include "launcher/plan/plan.h"
#include "launcher/supervise/job.h"
