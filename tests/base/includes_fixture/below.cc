// A base source using base alone: allowed.
#include "base/status.h"
#include "base/utf8.h"
