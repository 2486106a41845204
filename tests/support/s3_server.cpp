#include "support/s3_server.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>

namespace tsnap::test_support {

namespace {

const char* const kScript = TSNAP_TESTS_DIR "/../scripts/s3-server.sh";

// Runs `command` with sh, stdout and stderr together; returns the exit status and the output.
int run(const std::string& command, std::string* output) {
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) output->append(buf, n);
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

S3Server::S3Server() {
  if (::access(kScript, X_OK) != 0) {
    why_ = std::string("no S3 test server: ") + kScript + " is missing";
    return;
  }
  char dir[] = "/tmp/tsnap-s3-XXXXXX";
  if (::mkdtemp(dir) == nullptr) {
    why_ = "no S3 test server: mkdtemp failed";
    return;
  }
  state_dir_ = dir;
  std::string out;
  const int status = run("TSNAP_S3_STATE=" + shell_quoted(state_dir_) + " TSNAP_S3_OWNER_PID=" +
                             std::to_string(::getpid()) + " " + shell_quoted(kScript) + " start",
                         &out);
  std::map<std::string, std::string> vars;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("export ", 0) != 0) continue;
    const size_t eq = line.find('=');
    if (eq != std::string::npos) vars[line.substr(7, eq - 7)] = line.substr(eq + 1);
  }
  endpoint_ = vars["AWS_ENDPOINT_URL_S3"];
  region_ = vars["AWS_REGION"];
  access_key_ = vars["AWS_ACCESS_KEY_ID"];
  secret_key_ = vars["AWS_SECRET_ACCESS_KEY"];
  name_ = vars["TSNAP_S3_SERVER"];
  if (status != 0 || endpoint_.empty() || access_key_.empty() || secret_key_.empty()) {
    const char* chosen = std::getenv("TSNAP_S3_SERVER");
    const std::string env = chosen != nullptr && *chosen != '\0'
                                ? std::string("TSNAP_S3_SERVER=") + chosen + " "
                                : std::string();
    why_ = "no S3 test server (" + env + "scripts/s3-server.sh install sets one up): " + env +
           "scripts/s3-server.sh start exited " + std::to_string(status) + ":\n" + out;
    return;
  }
  available_ = true;
}

S3Server::~S3Server() {
  if (state_dir_.empty()) return;
  std::string out;
  run("TSNAP_S3_STATE=" + shell_quoted(state_dir_) + " " + shell_quoted(kScript) + " stop", &out);
  std::error_code ec;
  std::filesystem::remove_all(state_dir_, ec);
}

S3Server& S3Server::shared() {
  static S3Server server;
  return server;
}

void S3Server::export_environment() const {
  const io::S3Config c = config();
  ::setenv("AWS_ENDPOINT_URL_S3", c.endpoint.c_str(), 1);
  ::setenv("AWS_REGION", c.region.c_str(), 1);
  ::setenv("AWS_ACCESS_KEY_ID", c.access_key.c_str(), 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", c.secret_key.c_str(), 1);
  ::setenv("TSNAP_S3_PATH_STYLE", "1", 1);
}

io::S3Config S3Server::config() const {
  io::S3Config c;
  c.endpoint = endpoint_;
  c.region = region_.empty() ? "us-east-1" : region_;
  c.access_key = access_key_;
  c.secret_key = secret_key_;
  c.path_style = true;
  c.attempts = 3;
  return c;
}

}  // namespace tsnap::test_support
