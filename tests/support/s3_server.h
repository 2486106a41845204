#pragma once
// A local S3-protocol server for the tests that speak S3 (scripts/s3-server.sh on 127.0.0.1),
// started by the tests themselves: moto, which checks credentials and SigV4 signatures, or with
// TSNAP_S3_SERVER=localstack in the environment LocalStack's own S3 provider, which does not.
//
//   auto& s3 = tsnap::test_support::S3Server::shared();
//   if (!s3.available()) GTEST_SKIP() << s3.why();
//   tsnap::io::S3Client client(s3.config());

#include <string>

#include "io/s3_client.h"

namespace tsnap::test_support {

/// One server process, started in the constructor and stopped in the destructor. It also stops
/// when the test program dies without clean-up (the script watches the program's pid).
/// Thread-safety: const methods only, after construction. Ownership: owns the server process
/// and its state directory (a temporary directory, removed by the destructor).
class S3Server {
 public:
  /// Runs `scripts/s3-server.sh start` on a free port, the server TSNAP_S3_SERVER names (moto
  /// when unset). Never throws: when the server cannot be started (not installed:
  /// scripts/s3-server.sh install) available() is false.
  S3Server();
  ~S3Server();
  S3Server(const S3Server&) = delete;
  S3Server& operator=(const S3Server&) = delete;

  /// The process-wide server, started on first use (thread-safe) and stopped at exit.
  static S3Server& shared();

  /// Whether the server runs.
  bool available() const { return available_; }
  /// Why it does not (for GTEST_SKIP), with the script's output.
  const std::string& why() const { return why_; }
  /// "http://127.0.0.1:PORT".
  const std::string& endpoint() const { return endpoint_; }
  /// Which server it is: "moto" or "localstack".
  const std::string& name() const { return name_; }
  /// Whether it refuses a wrong access key or secret as S3 does (403 InvalidAccessKeyId,
  /// SignatureDoesNotMatch). LocalStack's free S3 provider accepts any credentials; a test of
  /// refused credentials skips there with kCredentialsUnchecked.
  bool checks_credentials() const { return name_ != "localstack"; }
  /// Why a test of refused credentials skips where checks_credentials() is false.
  static constexpr const char* kCredentialsUnchecked =
      "LocalStack's S3 provider accepts any credentials (its documentation: the secret access "
      "key is ignored and IAM enforcement is off), where S3 refuses a wrong access key with 403 "
      "InvalidAccessKeyId and a wrong secret with 403 SignatureDoesNotMatch (Amazon S3 API "
      "Reference, Error responses); the moto run (ctest s3) checks it";
  /// The endpoint and the server's credentials: path-style, us-east-1, 3 attempts.
  io::S3Config config() const;
  /// Points the process's S3 environment at this server (AWS_ENDPOINT_URL_S3, AWS_REGION,
  /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, TSNAP_S3_PATH_STYLE), for code that reads it
  /// (`s3://` roots) and for child processes.
  void export_environment() const;

 private:
  bool available_ = false;
  std::string why_, state_dir_, name_, endpoint_, region_, access_key_, secret_key_;
};

}  // namespace tsnap::test_support
