#include "client/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/process.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace fulcrum {
namespace {

constexpr char kHost[] = "127.0.0.1";

absl::Status MakeDirs(const std::string& path) {
  std::string partial;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    partial += std::string(part) + "/";
    if (part.empty()) continue;
    if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat("cannot create ", partial, ": ", strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string AbsolutePath(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

bool Alive(pid_t pid) {
  // Reap it if it is our child and already exited.
  int status;
  if (waitpid(pid, &status, WNOHANG) == pid) return false;
  if (kill(pid, 0) != 0) return false;
  // A zombie (exited, not yet reaped by a parent that is not us) is dead.
  auto stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat.ok()) return true;
  size_t paren = stat->rfind(')');
  return paren == std::string::npos || paren + 2 >= stat->size() || (*stat)[paren + 2] != 'Z';
}

// Whether `pid` is still the cluster's process `id` of folder `dir`, not
// another that took its pid after it exited: every process of a local
// cluster has its own --port_file on its command line.
bool StillOurs(pid_t pid, const std::string& dir, const std::string& id) {
  auto cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
  if (!cmdline.ok()) return false;
  const std::string flag = absl::StrCat("--port_file=", dir, "/run/", id, ".ports");
  for (absl::string_view arg : absl::StrSplit(*cmdline, '\0')) {
    if (arg == flag) return true;
  }
  return false;
}

std::string LogTail(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return "";
  std::string tail = text->size() > 2000 ? text->substr(text->size() - 2000) : *text;
  return tail;
}

// fork + exec with stdout/stderr sent to `log`, in a session of its own so a
// terminal's Ctrl-C reaches only the CLI, which then stops everything.
}  // namespace

absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return absl::ResourceExhaustedError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    setsid();
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    int null = open("/dev/null", O_RDONLY);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    if (null >= 0) dup2(null, 0);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

absl::Status EnsureDevCertificates(const std::string& tls_dir, const std::string& bin_dir) {
  if (access((tls_dir + "/node.crt").c_str(), R_OK) == 0) return absl::OkStatus();
  // build/bin/ -> the source tree's scripts/ (or next to the binaries).
  for (const std::string& script : {bin_dir + "/../../scripts/dev-certs.sh", bin_dir + "/dev-certs.sh"}) {
    if (access(script.c_str(), X_OK) != 0) continue;
    if (std::system(absl::StrCat("'", script, "' '", tls_dir, "' >/dev/null").c_str()) == 0) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(script, " failed to make certificates in ", tls_dir));
  }
  return absl::NotFoundError(absl::StrCat("local up --tls: no certificates in ", tls_dir,
                                          ": make them with scripts/dev-certs.sh ", tls_dir));
}

std::string DefaultBinDir() {
  if (const char* env = std::getenv("FULCRUM_BIN_DIR"); env != nullptr && *env) return env;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return ".";
  std::string path(exe, n);
  return path.substr(0, path.rfind('/'));
}

LocalCluster::~LocalCluster() {
  if (!owned_) return;
  for (const v1::LocalProcess& p : file_.processes()) {
    if (StillOurs(static_cast<pid_t>(p.pid()), file_.dir(), p.id()))
      kill(static_cast<pid_t>(p.pid()), SIGKILL);
    waitpid(static_cast<pid_t>(p.pid()), nullptr, 0);
  }
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(Options options) {
  if (options.servers < 1 || options.workers < 0) {
    return absl::InvalidArgumentError("local up: --servers must be >= 1 and --workers >= 0");
  }
  if (options.replicas < 1 || options.replicas > 8 || options.replicas > options.servers) {
    return absl::InvalidArgumentError(absl::StrCat("local up: --replicas must be in [1, min(8, --servers)] (got ",
                                                   options.replicas, " with ", options.servers, " servers)"));
  }
  if (options.bin_dir.empty()) options.bin_dir = DefaultBinDir();
  options.dir = AbsolutePath(options.dir);
  RETURN_IF_ERROR(MakeDirs(options.dir + "/logs"));
  RETURN_IF_ERROR(MakeDirs(options.dir + "/run"));
  if (access((options.dir + "/cluster.json").c_str(), F_OK) == 0) {
    auto existing = Open(options.dir);
    if (existing.ok()) {
      int recorded_servers = 0;
      for (const auto& p : (*existing)->file().processes()) {
        if (Alive(static_cast<pid_t>(p.pid()))) {
          return absl::AlreadyExistsError(absl::StrCat(
              "a local cluster is already running in ", options.dir, " (", p.role(), " pid ", p.pid(),
              "): run `fulcrum local down --dir ", options.dir, "` first"));
        }
        if (p.role() == "server") {
          recorded_servers =
              std::max(recorded_servers, std::atoi(p.id().substr(p.id().rfind('-') + 1).c_str()) + 1);
        }
      }
      // A cluster that was killed (`local down` removes cluster.json): its
      // servers come back under their ids, those `local add server` added
      // too, as their state folders hold the checkpoints its jobs resume from.
      options.servers = std::max(options.servers, recorded_servers);
    }
  }
  std::unique_ptr<LocalCluster> cluster(new LocalCluster());
  cluster->options_ = options;
  cluster->owned_ = true;
  cluster->file_.set_dir(options.dir);
  cluster->file_.set_replicas(options.replicas);
  cluster->file_.set_tls(options.tls);
  for (const std::string& flag : options.server_flags) cluster->file_.add_server_flags(flag);
  for (const std::string& flag : options.worker_flags) cluster->file_.add_worker_flags(flag);
  if (options.tls) RETURN_IF_ERROR(EnsureDevCertificates(options.dir + "/tls", options.bin_dir));
  auto add_security = [&](std::vector<std::string>* flags, bool scheduler) {
    for (std::string& f : cluster->SecurityFlags(scheduler)) flags->push_back(std::move(f));
  };

  std::vector<std::string> scheduler_flags = options.scheduler_flags;
  scheduler_flags.push_back(absl::StrCat("--data_dir=", options.dir, "/scheduler-state"));
  scheduler_flags.push_back(absl::StrCat("--default_replicas=", options.replicas));
  add_security(&scheduler_flags, true);
  ASSIGN_OR_RETURN(v1::LocalProcess scheduler, cluster->Spawn("scheduler", "scheduler", scheduler_flags));
  cluster->file_.set_scheduler(scheduler.grpc_address());
  for (int i = 0; i < options.servers; ++i) RETURN_IF_ERROR(cluster->AddServer().status());
  for (int i = 0; i < options.workers; ++i) RETURN_IF_ERROR(cluster->AddWorker().status());
  return cluster;
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Open(const std::string& dir) {
  std::string path = AbsolutePath(dir) + "/cluster.json";
  auto text = ReadFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat("no local cluster in ", dir, " (", path,
                                            " missing): start one with `fulcrum local up --dir ", dir, "`"));
  }
  std::unique_ptr<LocalCluster> cluster(new LocalCluster());
  auto status = google::protobuf::util::JsonStringToMessage(*text, &cluster->file_);
  if (!status.ok()) return absl::DataLossError(absl::StrCat(path, ": ", status.ToString()));
  cluster->options_.dir = cluster->file_.dir();
  cluster->options_.bin_dir = DefaultBinDir();
  cluster->options_.server_flags.assign(cluster->file_.server_flags().begin(), cluster->file_.server_flags().end());
  cluster->options_.worker_flags.assign(cluster->file_.worker_flags().begin(), cluster->file_.worker_flags().end());
  return cluster;
}

std::string LocalCluster::NextId(const std::string& role) const {
  int highest = -1;
  for (const auto& p : file_.processes()) {
    if (p.role() != role) continue;
    std::string suffix = p.id().substr(p.id().rfind('-') + 1);
    highest = std::max(highest, std::atoi(suffix.c_str()));
  }
  return absl::StrCat(role, "-", highest + 1);
}

absl::StatusOr<v1::LocalProcess> LocalCluster::AddServer() {
  // Each server keeps its checkpoints in DIR/state/ID: a cluster started
  // again in the same folder finds them (same ids, same folders).
  const std::string id = NextId("server");
  return Spawn("server", id, ServerFlags(id));
}

std::vector<std::string> LocalCluster::SecurityFlags(bool scheduler) const {
  if (!file_.tls()) return {};
  const std::string tls = file_.dir() + "/tls";
  std::vector<std::string> flags = {"--tls_cert=" + tls + "/node.crt", "--tls_key=" + tls + "/node.key",
                                    "--tls_ca=" + tls + "/ca.crt", "--cluster_token_file=" + tls + "/cluster-token"};
  if (scheduler) flags.push_back("--token_file=" + tls + "/token");
  return flags;
}

std::vector<std::string> LocalCluster::ServerFlags(const std::string& id) const {
  std::vector<std::string> flags = options_.server_flags;
  flags.push_back(absl::StrCat("--data_dir=", file_.dir(), "/state/", id));
  return flags;
}

absl::StatusOr<v1::LocalProcess> LocalCluster::RestartServer(const std::string& id) {
  absl::StatusOr<v1::LocalProcess> restarted = RestartMember(id);
  if (restarted.ok() && restarted->role() != "server") return absl::NotFoundError(absl::StrCat("no server ", id));
  return restarted;
}

absl::StatusOr<v1::LocalProcess> LocalCluster::RestartMember(const std::string& id) {
  for (int i = 0; i < file_.processes_size(); ++i) {
    const v1::LocalProcess old = file_.processes(i);
    if (old.id() != id || (old.role() != "server" && old.role() != "worker")) continue;
    if (Alive(static_cast<pid_t>(old.pid()))) {
      return absl::FailedPreconditionError(absl::StrCat(old.role(), " ", id, " (pid ", old.pid(), ") is still running"));
    }
    file_.mutable_processes()->DeleteSubrange(i, 1);
    return Spawn(old.role(), id, old.role() == "server" ? ServerFlags(id) : options_.worker_flags);
  }
  return absl::NotFoundError(absl::StrCat("no server or worker ", id, " in ", file_.dir()));
}

absl::StatusOr<v1::LocalProcess> LocalCluster::AddWorker(std::vector<std::string> extra_flags) {
  std::vector<std::string> flags = options_.worker_flags;
  flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
  return Spawn("worker", NextId("worker"), std::move(flags));
}

absl::StatusOr<v1::LocalProcess> LocalCluster::Spawn(const std::string& role, const std::string& id,
                                                     std::vector<std::string> flags) {
  const std::string port_file = absl::StrCat(file_.dir(), "/run/", id, ".ports");
  const std::string log = absl::StrCat(file_.dir(), "/logs/", id, ".log");
  unlink(port_file.c_str());
  std::vector<std::string> argv = {absl::StrCat(options_.bin_dir, "/fulcrum-", role),
                                   absl::StrCat("--host=", kHost), "--metrics_port=0",
                                   absl::StrCat("--port_file=", port_file)};
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot run ", argv[0],
                                            ": build Fulcrum first or set FULCRUM_BIN_DIR"));
  }
  argv.push_back("--port=0");
  if (role != "scheduler") {
    argv.push_back(absl::StrCat("--scheduler=", file_.scheduler()));
    argv.push_back(absl::StrCat("--id=", id));
    for (std::string& f : SecurityFlags(/*scheduler=*/false)) argv.push_back(std::move(f));
  }
  for (std::string& f : flags) argv.push_back(std::move(f));
  ASSIGN_OR_RETURN(pid_t pid, SpawnProcess(argv, log));
  v1::LocalProcess process;
  process.set_role(role);
  process.set_id(id);
  process.set_pid(pid);
  process.set_log(log);
  *file_.add_processes() = process;  // recorded first, so a failure below still kills it
  absl::Time deadline = absl::Now() + options_.start_timeout;
  while (access(port_file.c_str(), F_OK) != 0) {
    if (!Alive(pid)) {
      return absl::UnavailableError(absl::StrCat(role, " ", id, " exited during start-up; its log ", log,
                                                 " ends with:\n", LogTail(log)));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(role, " ", id, " did not start within ",
                                                      absl::FormatDuration(options_.start_timeout),
                                                      "; see ", log));
    }
    absl::SleepFor(absl::Milliseconds(10));  // polling for the port file the child writes
  }
  ASSIGN_OR_RETURN(std::string text, ReadFile(port_file));
  v1::PortFile ports;
  if (auto s = google::protobuf::util::JsonStringToMessage(text, &ports); !s.ok()) {
    return absl::DataLossError(absl::StrCat(port_file, ": ", s.ToString()));
  }
  if (ports.grpc_port() > 0) process.set_grpc_address(absl::StrCat(kHost, ":", ports.grpc_port()));
  process.set_metrics_address(absl::StrCat(kHost, ":", ports.metrics_port()));
  *file_.mutable_processes(file_.processes_size() - 1) = process;
  RETURN_IF_ERROR(WriteFile());
  return process;
}

absl::Status LocalCluster::WriteFile() const {
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = true;
  print.preserve_proto_field_names = true;
  print.always_print_primitive_fields = true;
  auto status = google::protobuf::util::MessageToJsonString(file_, &json, print);
  if (!status.ok()) return absl::InternalError(status.ToString());
  RETURN_IF_ERROR(WriteFileAtomically(file_.dir() + "/cluster.json", json));
  // Prometheus file service discovery: one target group per process, with
  // its role and id as labels (deploy/prometheus/local-cluster.yml).
  std::vector<std::string> groups;
  for (const v1::LocalProcess& p : file_.processes()) {
    if (p.metrics_address().empty()) continue;
    groups.push_back(absl::StrCat("  {\"targets\": [\"", p.metrics_address(), "\"], \"labels\": {\"role\": \"",
                                  p.role(), "\", \"member\": \"", p.id(), "\"}}"));
  }
  return WriteFileAtomically(file_.dir() + "/prometheus-targets.json",
                             absl::StrCat("[\n", absl::StrJoin(groups, ",\n"), "\n]\n"));
}

absl::StatusOr<v1::LocalProcess> LocalCluster::RestartScheduler() {
  int index = -1;
  for (int i = 0; i < file_.processes_size(); ++i) {
    if (file_.processes(i).role() == "scheduler") index = i;
  }
  if (index < 0) return absl::NotFoundError("no scheduler in this local cluster");
  v1::LocalProcess old = file_.processes(index);
  pid_t pid = static_cast<pid_t>(old.pid());
  if (Alive(pid)) {
    return absl::FailedPreconditionError(absl::StrCat("the scheduler (pid ", pid, ") is still running"));
  }
  file_.mutable_processes()->DeleteSubrange(index, 1);
  std::vector<std::string> flags = options_.scheduler_flags;
  flags.push_back(absl::StrCat("--data_dir=", file_.dir(), "/scheduler-state"));
  flags.push_back(absl::StrCat("--default_replicas=", std::max(1, file_.replicas())));
  for (std::string& f : SecurityFlags(/*scheduler=*/true)) flags.push_back(std::move(f));
  flags.push_back(absl::StrCat("--port=", old.grpc_address().substr(old.grpc_address().rfind(':') + 1)));
  return Spawn("scheduler", "scheduler", flags);
}

absl::Status LocalCluster::Signal(const std::string& id, int signal) {
  for (const auto& p : file_.processes()) {
    if (p.id() != id) continue;
    if (!StillOurs(static_cast<pid_t>(p.pid()), file_.dir(), p.id())) {
      return absl::NotFoundError(absl::StrCat(id, " (pid ", p.pid(), ") is no longer running"));
    }
    if (kill(static_cast<pid_t>(p.pid()), signal) != 0) {
      return absl::NotFoundError(absl::StrCat("signal to ", id, " (pid ", p.pid(), "): ", strerror(errno)));
    }
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("no process ", id, " in ", file_.dir()));
}

absl::Status LocalCluster::Down(absl::Duration grace) {
  // Workers and servers first (servers hand their shards over through the
  // scheduler), the scheduler last.
  std::vector<std::string> killed;
  for (bool scheduler : {false, true}) {
    // Each stage has the whole grace: a process that needs it all (a paused
    // one) does not leave the scheduler none.
    const absl::Time deadline = absl::Now() + grace;
    // A process that exited (killed by hand, say) may have left its pid to
    // another: only pids that are still the cluster's are signalled.
    std::vector<const v1::LocalProcess*> ours;
    for (const auto& p : file_.processes()) {
      if ((p.role() == "scheduler") != scheduler) continue;
      if (!StillOurs(static_cast<pid_t>(p.pid()), file_.dir(), p.id())) {
        waitpid(static_cast<pid_t>(p.pid()), nullptr, WNOHANG);  // ours and exited: reaped
        continue;
      }
      ours.push_back(&p);
      kill(static_cast<pid_t>(p.pid()), SIGTERM);
      kill(static_cast<pid_t>(p.pid()), SIGCONT);  // a paused (SIGSTOP) process wakes to handle it
    }
    for (const v1::LocalProcess* p : ours) {
      pid_t pid = static_cast<pid_t>(p->pid());
      while (Alive(pid) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
      if (Alive(pid) && StillOurs(pid, file_.dir(), p->id())) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
        killed.push_back(p->id());
      }
    }
  }
  owned_ = false;
  unlink((file_.dir() + "/cluster.json").c_str());
  unlink((file_.dir() + "/prometheus-targets.json").c_str());
  if (!killed.empty()) {
    return absl::UnavailableError(absl::StrCat("did not stop on SIGTERM within ", absl::FormatDuration(grace),
                                               " and were killed: ", absl::StrJoin(killed, ", ")));
  }
  return absl::OkStatus();
}

}  // namespace fulcrum
