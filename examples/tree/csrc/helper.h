#pragma once
inline int helper() { return 41; }
