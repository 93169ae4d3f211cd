#pragma once
#define API 1
