#define LAUNCH_PREFIX kvp
#include "launch.inc"
