// spdlog's implementation, compiled once into the dsl_log library. Every
// target builds with SPDLOG_COMPILED_LIB, so its headers declare spdlog's
// functions instead of defining them inline; without that, each translation
// unit compiled the logger, registry, pattern formatter and colour sinks again
// at -O3 (about 8 s a unit on this project's 2-core machines: a third of the
// programs' build; docs/performance.md). Debian's libspdlog-dev ships only a
// shared library, and dslaunch and dsagent link their libraries in
// (DSL_STATIC_LIBS), so the implementation headers are compiled here.
//
// What is instantiated is what the programs and tests use: loggers with any
// sinks, the colour console sinks and their factories, base_sink (the
// ostream sink of the tests derives from it).
#ifndef SPDLOG_COMPILED_LIB
#error "dsl_log compiles spdlog with SPDLOG_COMPILED_LIB"
#endif

#include <spdlog/common-inl.h>
#include <spdlog/details/backtracer-inl.h>
#include <spdlog/details/log_msg-inl.h>
#include <spdlog/details/log_msg_buffer-inl.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/details/os-inl.h>
#include <spdlog/details/periodic_worker-inl.h>
#include <spdlog/details/registry-inl.h>
#include <spdlog/logger-inl.h>
#include <spdlog/pattern_formatter-inl.h>
#include <spdlog/sinks/ansicolor_sink-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/sink-inl.h>
#include <spdlog/sinks/stdout_color_sinks-inl.h>
#include <spdlog/spdlog-inl.h>

#include <mutex>

namespace spdlog {

template logger::logger(std::string name, sinks_init_list::iterator begin,
                        sinks_init_list::iterator end);

namespace sinks {
template class base_sink<std::mutex>;
template class base_sink<details::null_mutex>;
template class ansicolor_sink<details::console_mutex>;
template class ansicolor_sink<details::console_nullmutex>;
template class ansicolor_stdout_sink<details::console_mutex>;
template class ansicolor_stdout_sink<details::console_nullmutex>;
template class ansicolor_stderr_sink<details::console_mutex>;
template class ansicolor_stderr_sink<details::console_nullmutex>;
}  // namespace sinks

template std::shared_ptr<logger> stdout_color_mt<synchronous_factory>(
    const std::string& logger_name, color_mode mode);
template std::shared_ptr<logger> stdout_color_st<synchronous_factory>(
    const std::string& logger_name, color_mode mode);
template std::shared_ptr<logger> stderr_color_mt<synchronous_factory>(
    const std::string& logger_name, color_mode mode);
template std::shared_ptr<logger> stderr_color_st<synchronous_factory>(
    const std::string& logger_name, color_mode mode);

}  // namespace spdlog
