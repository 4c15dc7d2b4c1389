// fulcrum: the user's command line. See `fulcrum help`.
#include <string>
#include <vector>

#include "client/cli.h"
#include "common/sync.h"

int main(int argc, char** argv) {
  fulcrum::SetMutexDeadlockDetection(false);  // as every daemon (common/sync.h)
  std::vector<std::string> args(argv + 1, argv + argc);
  return fulcrum::RunCli(args);
}
