// fulcrum: the user's command line. See `fulcrum help`.
#include <string>
#include <vector>

#include "client/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return fulcrum::RunCli(args);
}
