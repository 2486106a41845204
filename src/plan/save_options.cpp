// What include/tsnap/save_options.h defines beyond its structs.

#include "tsnap/save_options.h"

#include "format/layout.h"

namespace tsnap {

std::vector<std::string> optimizer_moment_keys() { return format::optimizer_moment_globs(); }

}  // namespace tsnap
