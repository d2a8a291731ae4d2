#define LAUNCH_PREFIX kvs
#define WITH_GROUPED
#include "launch.inc"
