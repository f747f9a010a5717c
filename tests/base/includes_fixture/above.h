// A base header that reaches up into the wire protocol: refused.
#include "base/status.h"
#include "proto/channel.h"
