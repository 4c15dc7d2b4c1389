// The `fulcrum` command line: a gRPC client of the scheduler's JobService and
// ClusterService, plus `local up|add|down` for a cluster on loopback.
#ifndef FULCRUM_CLIENT_CLI_H_
#define FULCRUM_CLIENT_CLI_H_

#include <string>
#include <vector>

namespace fulcrum {

// Runs the CLI; returns the process exit code (0 success, 1 the job or call
// failed, 2 usage error).
int RunCli(const std::vector<std::string>& args);

}  // namespace fulcrum

#endif  // FULCRUM_CLIENT_CLI_H_
