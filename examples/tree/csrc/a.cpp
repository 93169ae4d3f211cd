#include "api.h"
extern "C" int a() { return API; }
