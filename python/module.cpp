// ramtrain._ramtrain: the engine's commands, called in-process from Python.
// A thin layer: the Python package (python/ramtrain) turns keyword arguments
// into the CLI's argv and calls run(), which runs the very command the
// `ramtrain` executable runs (cli/commands.h) with the GIL released. What the
// module adds: the metrics records handed to a Python function (the run
// logger's sink), record streams pulled from a Python function (data/records.h),
// stdout captured for the commands whose printout is their result (plan
// --json, eval --json, sample), and the stop request a callback can make.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "data/records.h"
#include "engine/run_logger.h"
#include "engine/trainer.h"

namespace nb = nanobind;

namespace {

// File descriptor 1 sent to a temporary file while a command runs (C stdio
// and any child's writes alike), then put back; the text is returned.
class StdoutCapture {
 public:
  explicit StdoutCapture(bool on) {
    if (!on) return;
    std::fflush(stdout);
    tmp_ = std::tmpfile();
    if (!tmp_) rt::fail("[python] cannot create a temporary file to capture the command's output");
    saved_ = ::dup(STDOUT_FILENO);
    if (saved_ < 0 || ::dup2(::fileno(tmp_), STDOUT_FILENO) < 0) {
      std::fclose(tmp_);
      rt::fail("[python] cannot redirect stdout to capture the command's output");
    }
  }
  ~StdoutCapture() { finish(); }
  std::string finish() {
    std::string out;
    if (!tmp_) return out;
    std::fflush(stdout);
    ::dup2(saved_, STDOUT_FILENO);
    ::close(saved_);
    std::rewind(tmp_);
    char buf[1 << 14];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, tmp_)) > 0) out.append(buf, n);
    std::fclose(tmp_);
    tmp_ = nullptr;
    return out;
  }

 private:
  FILE* tmp_ = nullptr;
  int saved_ = -1;
};

// A Python object held by C++ code that may copy or drop it without the GIL:
// the last owner takes the GIL to release it.
std::shared_ptr<nb::object> hold(nb::object o) {
  return std::shared_ptr<nb::object>(new nb::object(std::move(o)), [](nb::object* p) {
    nb::gil_scoped_acquire gil;
    delete p;
  });
}

// run(command, args, on_record, capture, stop_on_signal) -> (exit code, captured stdout, error kind, message)
// error kind: "" (none), "error" (rt::Error: the CLI's "error:"), "internal".
nb::tuple run(const std::string& command, const std::vector<std::string>& args, nb::object on_record, bool capture,
              bool stop_on_signal) {
  rt::cli::CommandFn fn = rt::cli::find_command(command);
  if (!fn) throw nb::value_error(("ramtrain: unknown command '" + command + "'").c_str());
  rt::reset_stop_request();
  if (!on_record.is_none()) {
    std::shared_ptr<nb::object> f = hold(on_record);
    rt::set_metrics_sink([f](const std::string& json) {
      nb::gil_scoped_acquire gil;
      try {
        (*f)(json);
      } catch (nb::python_error& e) {  // the Python side catches its callbacks' errors; this is a backstop
        e.discard_as_unraisable("ramtrain metrics callback");
      }
    });
  }
  int code = 0;
  std::string kind, message, out;
  {
    StdoutCapture cap(capture);
    nb::gil_scoped_release nogil;
    // SIGINT/SIGTERM ask the command to stop (checkpoint at the next step, as in the CLI) from the start,
    // not only once it installs the handler itself; the Python side puts its own handlers back after.
    if (stop_on_signal) rt::install_stop_handler();
    try {
      code = fn(args);
    } catch (const rt::Error& e) {
      kind = "error";
      message = e.what();
      code = 1;
    } catch (const std::bad_alloc&) {
      kind = "error";
      message = "out of host memory";
      code = 1;
    } catch (const std::exception& e) {
      kind = "internal";
      message = e.what();
      code = 3;
    }
    out = cap.finish();
  }
  rt::set_metrics_sink(nullptr);
  return nb::make_tuple(code, out, kind, message);
}

// cli(argv) -> exit code: `ramtrain ARGV...` in this process (python -m ramtrain).
int cli(const std::vector<std::string>& argv) {
  rt::reset_stop_request();
  nb::gil_scoped_release nogil;
  return rt::cli::run_cli(argv);
}

// add_stream(label, pull) -> name: pull() returns a str of whole jsonl lines, or None at the end.
std::string add_stream(const std::string& label, nb::object pull) {
  std::shared_ptr<nb::object> f = hold(std::move(pull));
  return rt::record_stream_add(label, [f, label](std::string& chunk) -> bool {
    nb::gil_scoped_acquire gil;
    try {
      nb::object r = (*f)();
      if (r.is_none()) return false;
      chunk = nb::cast<std::string>(r);
      return true;
    } catch (nb::python_error& e) {
      rt::fail("[data] the Python data (", label, ") raised: ", e.what());
    } catch (const nb::cast_error&) {
      rt::fail("[data] the Python data (", label, "): internal: a chunk of records is not a str");
    }
  });
}

}  // namespace

NB_MODULE(_ramtrain, m) {
  m.doc() = "ramtrain's C++ engine, in-process (use the ramtrain package, not this module)";
  m.def("run", &run, nb::arg("command"), nb::arg("args"), nb::arg("on_record").none(), nb::arg("capture") = false,
        nb::arg("stop_on_signal") = false);
  m.def("cli", &cli, nb::arg("argv"));
  m.def("add_stream", &add_stream, nb::arg("label"), nb::arg("pull"));
  m.def("remove_stream", [](const std::string& name) { rt::record_stream_remove(name); }, nb::arg("name"));
  m.def("request_stop", [] { rt::Trainer::stop_flag().store(true); },
        "Asks a running train (or sample) to stop at the next step boundary, saving a checkpoint, as SIGINT does.");
#ifdef RAMTRAIN_HAVE_CUDA
  m.attr("cuda_build") = true;
#else
  m.attr("cuda_build") = false;
#endif
}
