#include "api.h"
extern "C" int b() { return API + 1; }
