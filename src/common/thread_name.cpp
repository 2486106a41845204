#include "common/thread_name.h"

#include <pthread.h>

#include <cstring>

namespace tsnap::detail {

void name_this_thread(const char* name) {
#ifdef __linux__
  char buf[16];  // the kernel's limit, NUL included
  std::strncpy(buf, name, sizeof buf - 1);
  buf[sizeof buf - 1] = '\0';
  (void)::pthread_setname_np(::pthread_self(), buf);
#else
  (void)name;
#endif
}

}  // namespace tsnap::detail
