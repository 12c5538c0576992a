// TSIM harness: runs the Verilated vta_core's clock loop in C++ and serves its memory port from a host DRAM image.
//
// Python (vta.tsim.bridge) runs a program with tsim_open() (a fresh model, so SRAM contents never leak from one
// program to the next: reset, then the `start` pulse), tsim_resume() called repeatedly, each call clocking at most a
// slice of cycles (so the caller's Ctrl-C handler runs between slices), until `done`, until a cycle budget runs out,
// until the watchdog fires (no `progress` for a number of cycles) or until the core addresses memory outside the DRAM
// image, and tsim_close(). The DRAM image is a caller-owned buffer (a numpy array): reads and writes go to it
// directly, after a bounds check on every request and every write beat.
//
// Sparse DRAM: tsim_window adds, before a run's first tsim_resume, up to TSIM_MAX_WINDOWS - 1 more caller-owned
// buffers at higher byte addresses (the image is the window at address 0), so a program can address DRAM at hundreds
// of megabytes without a dense image that large. A request or write beat must lie within one window; anything else,
// a gap between windows included, is a memory error.
//
// Reset between programs: tsim_restart asserts `rst` on the run's model (the same model: its registers see the
// reset, its memories keep their contents), whether its program finished or was cut short (by a cycle budget), the
// host forgetting its outstanding read requests, and starts the next program on a new image, as a host does between
// jobs. A core whose registers do not all return to their reset values then runs the next program from a state
// fsim never has.
//
// Memory model (docs/core-interface.md): a read request accepted in cycle t returns its first beat no earlier than
// cycle t + latency, then one beat per cycle while the core takes them; requests are served in order; at most
// TSIM_MAX_OUTSTANDING requests are in flight (mem_rd_req_ready drops when the queue is full). Writes are accepted
// every cycle (mem_wr_ready high) unless random backpressure is on (below). Memory is beat-granular: when the image's
// size is not a multiple of the bus width, its last beat is partial; reads of it return zeros past the end, writes to
// it may only strobe bytes inside the image.
//
// Random backpressure (off unless tsim_stall is called after tsim_open): seeded by the caller, each cycle the host
// drops mem_rd_req_ready, holds back a read beat it could present, and drops mem_wr_ready, each with its own
// probability (of 65536), and each read request's first beat comes a uniformly drawn 0..extra_latency cycles later
// than the latency says (requests are still served in order). The draws depend only on the seed and the cycle's
// host state (three a cycle, one more per accepted request), so the same seed and core give the same run, cycle for
// cycle. A core that loses or duplicates beats or tokens when its handshakes stall then hangs or computes wrong data.
//
// Clock scheduling: by default each cycle is one evaluation of the model, at the rising edge, with the host's inputs
// for that cycle already applied; the handshakes are decided from the outputs as they settled after the previous
// edge. That is exact because the core's memory-port outputs depend only on its state, never combinationally on its
// inputs (tests/test_tsim_agreement.py checks it: every run gives the same cycles, counters and DRAM with
// `two_phase`, which evaluates the model at both edges and reads the outputs after the inputs settle). Verilator
// detects a rising edge against the clock's value at the previous evaluation; TSIM_CLK_PREV names that member of the
// model's root (build.py finds it in the generated header), and the harness clears it before each evaluation,
// halving the work.
// Without TSIM_CLK_PREV every run is two-phase.
//
// Compile-time parameters: TSIM_BUS_BYTES (B, bytes per beat), TSIM_TRACE (0 none, 1 VCD, 2 FST), TSIM_CLK_PREV.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <type_traits>

#include "Vvta_core.h"
#include "verilated.h"
#ifdef TSIM_CLK_PREV
#include "Vvta_core___024root.h"
static const bool kOneEval = true;
#else
static const bool kOneEval = false;
#endif

#if TSIM_TRACE == 1
#include "verilated_vcd_c.h"
typedef VerilatedVcdC TraceFile;
#elif TSIM_TRACE == 2
#include "verilated_fst_c.h"
typedef VerilatedFstC TraceFile;
#endif

#ifndef TSIM_BUS_BYTES
#error "TSIM_BUS_BYTES must be defined"
#endif
#ifndef TSIM_MAX_OUTSTANDING
#define TSIM_MAX_OUTSTANDING 64
#endif

static const uint32_t kBus = TSIM_BUS_BYTES;

// Status codes, mirrored in bridge.py.
enum TsimStatus : int32_t {
    TSIM_DONE = 0,
    TSIM_BUDGET = 1,
    TSIM_WATCHDOG = 2,
    TSIM_MEM_ERROR = 3,
    TSIM_BAD_ARGS = 4,
    TSIM_RUNNING = 5,  // tsim_resume: the slice ended, the run goes on
};

// Filled by tsim_resume; layout mirrored by bridge._Info (ctypes).
struct TsimInfo {
    uint64_t cycles;          // cycles clocked after the start pulse (the start cycle itself not counted)
    uint64_t idle_cycles;     // consecutive cycles without progress when the run stopped
    uint64_t err_addr;        // MEM_ERROR: first byte address of the offending access
    uint64_t err_bytes;       // MEM_ERROR: bytes the access spans
    int32_t status;           // TsimStatus
    int32_t err_write;        // MEM_ERROR: 1 for a write, 0 for a read request
    uint64_t rd_requests;     // read requests accepted
    uint64_t rd_beats;        // read beats delivered
    uint64_t wr_beats;        // write beats accepted
    uint64_t done_cycle;      // value of `cycles` when done rose (the drain after it is not part of the run's time)
};

// ---- moving bytes between the DRAM image and ports of any width --------------------------------------------------
template <typename T>
static inline void put_beat(T& port, const uint8_t* src) {
    static_assert(std::is_integral<T>::value, "scalar port");
    uint64_t v = 0;
    std::memcpy(&v, src, kBus);
    port = static_cast<T>(v);
}
template <std::size_t N>
static inline void put_beat(VlWide<N>& port, const uint8_t* src) {
    std::memcpy(port.data(), src, kBus);
}
template <typename T>
static inline void get_beat(const T& port, uint8_t* dst) {
    uint64_t v = static_cast<uint64_t>(port);
    std::memcpy(dst, &v, kBus);
}
template <std::size_t N>
static inline void get_beat(const VlWide<N>& port, uint8_t* dst) {
    std::memcpy(dst, port.data(), kBus);
}
template <typename T>
static inline bool strobe_bit(const T& port, uint32_t i) {
    return (static_cast<uint64_t>(port) >> i) & 1;
}
template <std::size_t N>
static inline bool strobe_bit(const VlWide<N>& port, uint32_t i) {
    return (port.data()[i / 32] >> (i % 32)) & 1;
}
template <typename T>
static inline bool strobe_full(const T& port) {
    uint64_t all = (kBus >= 64) ? ~0ull : ((1ull << kBus) - 1);
    return (static_cast<uint64_t>(port) & all) == all;
}
template <std::size_t N>
static inline bool strobe_full(const VlWide<N>& port) {
    for (uint32_t i = 0; i < kBus / 32; ++i)
        if (port.data()[i] != 0xffffffffu) return false;
    return true;
}

namespace {

// splitmix64: the random backpressure's generator (small, fast, the same on every platform).
static inline uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Random backpressure settings (see the header comment); all zero: off.
struct Stall {
    uint64_t state = 0;          // the generator's state (seeded by tsim_stall)
    uint32_t rd_req = 0;         // P(mem_rd_req_ready held low in a cycle), of 65536
    uint32_t rd_data = 0;        // P(a presentable read beat held back a cycle), of 65536
    uint32_t wr = 0;             // P(mem_wr_ready held low in a cycle), of 65536
    uint32_t extra_latency = 0;  // a read request's first beat comes 0..extra_latency cycles later (uniform)
    bool on = false;
    uint64_t stalls[3] = {0, 0, 0};  // cycles the host held rd_req_ready low, held a beat back, held wr_ready low

    // True with probability p/65536 (one draw).
    inline bool draw(uint32_t p) { return (splitmix64(state) & 0xffff) < p; }
};

// One caller-owned buffer of the DRAM: `size` bytes at byte address `base` (a multiple of the bus width).
struct Window {
    uint64_t base;
    uint8_t* data;
    uint64_t size;  // bytes in the buffer
    uint64_t span;  // size rounded up to whole beats: the last beat may be partial
};

#ifndef TSIM_MAX_WINDOWS
#define TSIM_MAX_WINDOWS 8
#endif

struct ReadReq {
    uint32_t window;    // the window the request lies in
    uint64_t addr;      // byte address of the next beat
    uint32_t left;      // beats still to deliver
    uint64_t ready_at;  // first cycle the next beat may be presented
};

class Sim {
  public:
    Sim(uint8_t* dram, uint64_t dram_size, uint32_t latency, TsimInfo* info, bool two_phase = true)
        : ctx_(new VerilatedContext),
          latency_(latency),
          info_(info),
          two_phase_(two_phase || !kOneEval) {
        set_image(dram, dram_size);
        ctx_->randReset(0);
        top_.reset(new Vvta_core(ctx_.get(), "vta_core"));
    }
    ~Sim() {
#if TSIM_TRACE
        close_trace();
#endif
        top_->final();
    }

    Vvta_core* top() { return top_.get(); }
    Stall& stall() { return stall_; }

    // The image (`size` bytes at address 0) becomes the only window.
    void set_image(uint8_t* dram, uint64_t size) {
        windows_[0] = Window{0, dram, size, (size + kBus - 1) / kBus * kBus};
        n_windows_ = 1;
    }

    // Adds a window; false when `base` is not a multiple of the bus width, the window is empty, wraps past 2**64,
    // overlaps another window, or the table is full.
    bool add_window(uint64_t base, uint8_t* data, uint64_t size) {
        uint64_t span = (size + kBus - 1) / kBus * kBus;
        if (!data || size == 0 || base % kBus || base + span < base || n_windows_ >= TSIM_MAX_WINDOWS) return false;
        for (uint32_t i = 0; i < n_windows_; ++i) {
            const Window& w = windows_[i];
            if (base < w.base + w.span && w.base < base + span) return false;
        }
        windows_[n_windows_++] = Window{base, data, size, span};
        return true;
    }

    // Forgets the host's outstanding reads and the cycle count, and turns random backpressure off: the host's side
    // of a reset between programs (tsim_restart).
    void clear_host() {
        queue_.clear();
        stall_ = Stall();
        cycle_ = 0;
        progress_ = false;
    }

#if TSIM_TRACE
    void open_trace(const char* path, uint64_t begin, uint64_t end) {
        ctx_->traceEverOn(true);
        trace_.reset(new TraceFile);
        top_->trace(trace_.get(), 99);
        trace_->open(path);
        trace_begin_ = begin;
        trace_end_ = end;
    }
    void close_trace() {
        if (trace_) trace_->close();
        trace_.reset();
    }
#endif

    // One clock cycle: drive host inputs, settle, sample handshakes, rising edge. Returns false on a memory error.
    inline bool step() {
        Vvta_core* t = top_.get();
        // Host inputs for this cycle depend only on host state, never combinationally on core outputs.
        bool have_beat = !queue_.empty() && queue_.front().ready_at <= cycle_;
        bool req_ready = queue_.size() < TSIM_MAX_OUTSTANDING;
        bool wr_ready = true;
        if (stall_.on) {  // three draws every cycle, whatever the core does
            bool hold_req = stall_.draw(stall_.rd_req), hold_beat = stall_.draw(stall_.rd_data);
            bool hold_wr = stall_.draw(stall_.wr);
            stall_.stalls[0] += req_ready && hold_req;
            stall_.stalls[1] += have_beat && hold_beat;
            stall_.stalls[2] += hold_wr;
            req_ready = req_ready && !hold_req;
            have_beat = have_beat && !hold_beat;
            wr_ready = !hold_wr;
        }
        t->mem_rd_data_valid = have_beat;
        if (have_beat) present_beat(windows_[queue_.front().window], queue_.front().addr);
        t->mem_rd_req_ready = req_ready;
        t->mem_wr_ready = wr_ready;
        if (two_phase_) {
            t->clk = 0;
            t->eval();
            dump(2 * cycle_);
        }
        progress_ = t->progress;
        // Handshakes committed at the coming rising edge.
        if (t->mem_rd_req_valid && t->mem_rd_req_ready) {
            uint64_t addr = t->mem_rd_req_addr;
            uint32_t len = t->mem_rd_req_len;
            uint64_t bytes = uint64_t(len) * kBus;
            // Reads may cover the image's last, partial beat (bytes past the end read as zero), nothing beyond.
            uint32_t w = find(addr, bytes);
            if (len == 0 || addr % kBus || w == kNoWindow) return fail(addr, len == 0 ? 0 : bytes, 0);
            uint64_t extra = stall_.on && stall_.extra_latency
                                 ? splitmix64(stall_.state) % (uint64_t(stall_.extra_latency) + 1) : 0;
            queue_.push_back(ReadReq{w, addr, len, cycle_ + latency_ + extra});
            info_->rd_requests++;
        }
        if (have_beat && t->mem_rd_data_ready) {
            ReadReq& r = queue_.front();
            info_->rd_beats++;
            r.addr += kBus;
            r.ready_at = cycle_ + 1;
            if (--r.left == 0) {
                queue_.pop_front();
                if (!queue_.empty() && queue_.front().ready_at < cycle_ + 1) queue_.front().ready_at = cycle_ + 1;
            }
        }
        if (t->mem_wr_valid && wr_ready) {
            uint64_t addr = t->mem_wr_addr;
            uint32_t w = find(addr, kBus);
            if (addr % kBus || w == kNoWindow || !write_beat(windows_[w], addr)) return fail(addr, kBus, 1);
            info_->wr_beats++;
        }
        rise();
        dump(2 * cycle_ + 1);
        cycle_++;
        return true;
    }

    // The rising edge: one evaluation (see the header comment), or clock low then high when two-phase.
    inline void rise() {
        Vvta_core* t = top_.get();
#ifdef TSIM_CLK_PREV
        if (!two_phase_) {
            t->rootp->TSIM_CLK_PREV = 0;
            t->clk = 1;
            t->eval();
            return;
        }
#endif
        if (t->clk) {
            t->clk = 0;
            t->eval();
        }
        t->clk = 1;
        t->eval();
    }

    void reset(uint32_t cycles) {
        Vvta_core* t = top_.get();
        t->rst = 1;
        t->start = 0;
        t->mem_rd_req_ready = 0;
        t->mem_rd_data_valid = 0;
        t->mem_wr_ready = 0;
        for (uint32_t i = 0; i < cycles; ++i) {
            t->clk = 0;
            t->eval();
            t->clk = 1;
            t->eval();
        }
        t->rst = 0;
    }

    uint64_t cycle() const { return cycle_; }
    bool progress() const { return progress_; }

    uint64_t counter(uint32_t index) {
        top_->csr_addr = index;
        top_->eval();
        return top_->csr_rdata;
    }

  private:
    static const uint32_t kNoWindow = ~0u;

    // The window holding bytes [addr, addr + bytes) (up to its last, partial beat), or kNoWindow.
    inline uint32_t find(uint64_t addr, uint64_t bytes) const {
        for (uint32_t i = 0; i < n_windows_; ++i) {
            const Window& w = windows_[i];
            if (addr >= w.base && bytes <= w.span && addr - w.base <= w.span - bytes) return i;
        }
        return kNoWindow;
    }

    bool fail(uint64_t addr, uint64_t bytes, int write) {
        info_->status = TSIM_MEM_ERROR;
        info_->err_addr = addr;
        info_->err_bytes = bytes;
        info_->err_write = write;
        return false;
    }

    // The beat at byte `addr` of window `w` (checked: inside its span) onto mem_rd_data; bytes past the window's
    // end read as zero.
    inline void present_beat(const Window& w, uint64_t addr) {
        Vvta_core* t = top_.get();
        uint64_t at = addr - w.base;
        if (at + kBus <= w.size) {
            put_beat(t->mem_rd_data, w.data + at);
            return;
        }
        uint8_t tmp[kBus] = {0};
        std::memcpy(tmp, w.data + at, w.size - at);
        put_beat(t->mem_rd_data, tmp);
    }

    // Writes the beat at byte `addr` of window `w` (inside its span) under its strobes. Returns false, writing
    // nothing, when a strobed byte lies past the window's end (only possible in its last, partial beat).
    inline bool write_beat(const Window& w, uint64_t addr) {
        Vvta_core* t = top_.get();
        uint64_t at = addr - w.base;
        bool partial = at + kBus > w.size;
        if (!partial && strobe_full(t->mem_wr_strb)) {
            get_beat(t->mem_wr_data, w.data + at);
            return true;
        }
        if (partial)
            for (uint64_t i = w.size - at; i < kBus; ++i)
                if (strobe_bit(t->mem_wr_strb, uint32_t(i))) return false;
        uint8_t tmp[kBus];
        get_beat(t->mem_wr_data, tmp);
        uint64_t n = partial ? w.size - at : kBus;
        for (uint32_t i = 0; i < n; ++i)
            if (strobe_bit(t->mem_wr_strb, i)) w.data[at + i] = tmp[i];
        return true;
    }

    inline void dump(uint64_t time) {
#if TSIM_TRACE
        if (trace_ && cycle_ >= trace_begin_ && cycle_ < trace_end_) trace_->dump(time);
#else
        (void)time;
#endif
    }

    std::unique_ptr<VerilatedContext> ctx_;
    std::unique_ptr<Vvta_core> top_;
#if TSIM_TRACE
    std::unique_ptr<TraceFile> trace_;
    uint64_t trace_begin_ = 0, trace_end_ = 0;
#endif
    Window windows_[TSIM_MAX_WINDOWS];  // [0] is the image, at address 0
    uint32_t n_windows_ = 0;
    uint64_t latency_;
    TsimInfo* info_;
    std::deque<ReadReq> queue_;
    Stall stall_;
    bool two_phase_;
    uint64_t cycle_ = 0;
    bool progress_ = false;
};

}  // namespace

extern "C" {

// Bytes per memory beat the library was built for.
uint32_t tsim_bus_bytes() { return kBus; }

// 0: no trace support, 1: VCD, 2: FST.
int32_t tsim_trace_kind() { return TSIM_TRACE; }

// The start pulse (one cycle), with no memory traffic possible yet.
static void start(Sim& sim, uint32_t insn_addr, uint32_t insn_count) {
    Vvta_core* t = sim.top();
    t->insn_addr = insn_addr;
    t->insn_count = insn_count;
    t->start = 1;
    sim.rise();
    t->start = 0;
}

// One program's run, between tsim_open and tsim_close.
struct TsimRun {
    TsimInfo info;  // Sim updates the traffic counts here; copied to the caller's TsimInfo by every tsim_resume
    Sim sim;
    uint64_t idle = 0;      // consecutive cycles without progress
    uint64_t quiet = 0;     // consecutive cycles without progress after done (the drain)
    bool draining = false;  // done has risen
    bool over = false;      // a final status was returned

    TsimRun(uint8_t* dram, uint64_t dram_size, uint32_t latency, bool two_phase)
        : info(), sim(dram, dram_size, latency, &info, two_phase) {}
};

// Starts one program: `dram` (dram_size bytes, read and written in place until tsim_close) holds `insn_count`
// instructions at byte address `insn_addr`. Builds a fresh model, holds reset, pulses `start`. `trace_path` (may be
// NULL) records cycles [trace_begin, trace_end) when the library was built with trace support. `two_phase` != 0
// evaluates the model at both clock edges (the reference scheduling; see the header comment); a traced run always
// does. Returns the run's handle for tsim_resume and tsim_close, NULL when `dram` is NULL.
TsimRun* tsim_open(uint8_t* dram, uint64_t dram_size, uint32_t insn_addr, uint32_t insn_count, uint32_t latency,
                   const char* trace_path, uint64_t trace_begin, uint64_t trace_end, int32_t two_phase) {
    if (!dram) return nullptr;
    // A traced run is two-phase, so the waveform shows both clock edges.
    TsimRun* run = new TsimRun(dram, dram_size, latency,
                               two_phase != 0 || (TSIM_TRACE && trace_path && trace_path[0]));
    Sim& sim = run->sim;
#if TSIM_TRACE
    if (trace_path && trace_path[0]) sim.open_trace(trace_path, trace_begin, trace_end);
#else
    (void)trace_path;
    (void)trace_begin;
    (void)trace_end;
#endif
    sim.reset(4);
    start(sim, insn_addr, insn_count);
    return run;
}

// Adds a window of the DRAM to a run just opened (before its first tsim_resume): `size` bytes at `data` (read and
// written in place until tsim_close) at byte address `base`, a multiple of the bus width. Returns 0, or
// TSIM_BAD_ARGS (a run that already started, an empty or misaligned window, one overlapping another, or more than
// TSIM_MAX_WINDOWS windows in all).
int32_t tsim_window(TsimRun* run, uint64_t base, uint8_t* data, uint64_t size) {
    if (!run || run->sim.cycle() != 0 || !run->sim.add_window(base, data, size)) return TSIM_BAD_ARGS;
    return 0;
}

// Asserts `rst` for `reset_cycles` cycles on the run's model, which keeps its memories (the SRAM buffers), drops the
// host's outstanding reads, then starts a new program on the image `dram` (dram_size bytes at address 0; the run's
// other windows are dropped, and tsim_window may add new ones), as tsim_open does. The run may have finished, or
// stopped at its cycle budget (a program cut short); random backpressure is off until tsim_stall is called again, and
// a trace covers the first program only. Returns 0, or TSIM_BAD_ARGS (no run, no image, or a run that stopped for
// another reason).
int32_t tsim_restart(TsimRun* run, uint8_t* dram, uint64_t dram_size, uint32_t insn_addr, uint32_t insn_count,
                     uint32_t reset_cycles) {
    if (!run || !dram || (run->over && run->info.status != TSIM_DONE && run->info.status != TSIM_BUDGET))
        return TSIM_BAD_ARGS;
    Sim& sim = run->sim;
#if TSIM_TRACE
    sim.close_trace();
#endif
    sim.clear_host();
    sim.set_image(dram, dram_size);
    std::memset(&run->info, 0, sizeof(run->info));
    run->idle = run->quiet = 0;
    run->draining = run->over = false;
    sim.reset(reset_cycles);
    start(sim, insn_addr, insn_count);
    return 0;
}

// Turns random backpressure on for a run just opened (before its first tsim_resume): `seed` seeds the generator;
// `rd_req`, `rd_data`, `wr` are the probabilities (of 65536, each below 65536) that, in a cycle, mem_rd_req_ready is
// held low, a read beat that could be presented is held back, mem_wr_ready is held low; each read request's first
// beat comes 0..`extra_latency` cycles (uniform) after the run's latency. Returns 0, or TSIM_BAD_ARGS (a probability
// of 65536 or more, or a run that already started).
int32_t tsim_stall(TsimRun* run, uint64_t seed, uint32_t rd_req, uint32_t rd_data, uint32_t wr,
                   uint32_t extra_latency) {
    if (!run || run->sim.cycle() != 0 || rd_req >= 65536 || rd_data >= 65536 || wr >= 65536) return TSIM_BAD_ARGS;
    Stall& s = run->sim.stall();
    s.state = seed;
    s.rd_req = rd_req;
    s.rd_data = rd_data;
    s.wr = wr;
    s.extra_latency = extra_latency;
    s.on = rd_req || rd_data || wr || extra_latency;
    return 0;
}

// The cycles random backpressure held each channel so far: stalls[0] mem_rd_req_ready low (when the queue had
// room), stalls[1] a read beat held back, stalls[2] mem_wr_ready low.
void tsim_stall_counts(TsimRun* run, uint64_t* stalls) {
    for (int i = 0; i < 3; ++i) stalls[i] = run ? run->sim.stall().stalls[i] : 0;
}

// Clocks the run for at most `slice` more cycles. Stops for good after `max_cycles` cycles in all (0: no budget) or
// after `watchdog` cycles in a row without progress (0: no watchdog). After `done` the clock keeps running until
// nothing progresses for `drain` cycles (0: stop at done), so work FINISH did not wait for shows in the counters.
// Returns TSIM_RUNNING when the slice ended first (call again), else the final status; `info` then holds the run's
// figures, `counters[0..n_counters)` the core's counters and, on a watchdog stop, `counters_prev` the counters one
// cycle before the last (the caller diffs the two to see what each module was doing).
int32_t tsim_resume(TsimRun* run, uint64_t slice, uint64_t max_cycles, uint64_t watchdog, uint64_t drain,
                    uint64_t* counters, uint64_t* counters_prev, uint32_t n_counters, TsimInfo* info) {
    if (!run || !info || run->over || (n_counters && (!counters || !counters_prev))) {
        if (info) info->status = TSIM_BAD_ARGS;
        return TSIM_BAD_ARGS;
    }
    Sim& sim = run->sim;
    Vvta_core* t = sim.top();
    uint64_t stop = sim.cycle() + slice < sim.cycle() ? ~0ull : sim.cycle() + slice;
    int32_t status = TSIM_RUNNING;
    while (sim.cycle() < stop) {
        if (!run->draining && t->done) {
            run->info.done_cycle = sim.cycle();
            run->draining = true;
        }
        if (run->draining) {
            // Drain: modules may still finish work FINISH did not wait for (e.g. loads nothing reads later). Keep
            // clocking and serving memory until nothing progresses for `drain` cycles, so the counters see all of it.
            if (run->quiet >= drain || (max_cycles && sim.cycle() >= max_cycles)) {
                status = TSIM_DONE;
                break;
            }
            if (!sim.step()) {
                status = TSIM_MEM_ERROR;
                break;
            }
            run->quiet = sim.progress() ? 0 : run->quiet + 1;
            continue;
        }
        if (max_cycles && sim.cycle() >= max_cycles) {
            status = TSIM_BUDGET;
            break;
        }
        if (!sim.step()) {
            status = TSIM_MEM_ERROR;
            break;
        }
        run->idle = sim.progress() ? 0 : run->idle + 1;
        if (watchdog && run->idle >= watchdog) {
            status = TSIM_WATCHDOG;
            for (uint32_t i = 0; i < n_counters; ++i) counters_prev[i] = sim.counter(i);
            if (!sim.step()) status = TSIM_MEM_ERROR;
            break;
        }
    }
    if (status != TSIM_RUNNING) {
        run->over = true;
#if TSIM_TRACE
        sim.close_trace();
#endif
        for (uint32_t i = 0; i < n_counters; ++i) counters[i] = sim.counter(i);
    }
    run->info.cycles = sim.cycle();
    run->info.idle_cycles = run->idle;
    run->info.status = status;
    *info = run->info;
    return status;
}

// Ends a run (finished or not) and frees its model; the DRAM image is no longer touched.
void tsim_close(TsimRun* run) { delete run; }

// Clocks a fresh, idle core (reset, never started) for `cycles` cycles with the same clock scheduling as tsim_resume
// (`two_phase` likewise) but no memory service: the bare cost of evaluating the model, for benchmarks.
void tsim_idle_cycles(uint64_t cycles, int32_t two_phase) {
    TsimInfo info;
    std::memset(&info, 0, sizeof(info));
    uint8_t dram[64] = {0};
    Sim sim(dram, sizeof(dram), 1, &info, two_phase != 0);
    sim.reset(4);
    for (uint64_t i = 0; i < cycles; ++i) sim.rise();
}

// 1 when the library can evaluate once per cycle (TSIM_CLK_PREV was found), 0 when every run is two-phase.
int32_t tsim_one_eval() { return kOneEval ? 1 : 0; }

}  // extern "C"
