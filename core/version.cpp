#include "kiln/version.hpp"

const char* kiln::version() { return KILN_VERSION_STRING; }
