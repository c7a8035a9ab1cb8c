// Throughput driver for the JorenB/2d-cdt reference code (benchmark peer).
//
// Written for ivhl_jax's benchmarks; it contains no code from 2d-cdt, it only
// #includes its headers and links against its objects (universe.o,
// simulation.o, vertex.o, triangle.o, link.o, observable.o).
//
// The peer's per-move methods (Simulation::moveAdd/moveDelete/moveFlip) and
// its RNGs are private. To count attempted moves per type exactly, this
// translation unit (and only this one) is compiled after
// `#define private public`; all affected classes have either only static
// members or all data members under one access specifier, so layouts and
// mangled names are unchanged.
//
// Move mix: the peer's attemptMove() picks {add, delete} with total weight
// moveFreqs[0] = 1 and flip with weight moveFreqs[1] = 1, then add vs delete
// with probability 1/2 each => P(add) = P(delete) = 1/4, P(flip) = 1/2.
// The timed loop below draws the same mix (one uniform integer in [0, 3]) from
// the peer's own Simulation::rng and calls the corresponding move method.
// A second timed loop calls the peer's public Simulation::attemptMove() as is,
// to show the dispatch here costs nothing extra.
//
// Output: one JSON line on stdout.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#include <array>
#include <algorithm>
#include <iostream>
#include <fstream>
#include <unordered_map>
#include <typeinfo>
#include <cassert>
#include <ctime>

#define private public
#include "universe.hpp"
#include "simulation.hpp"
#undef private

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
	return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU time of this process (user + system), robust to sharing the cores with other jobs.
double cpu_now() {
	timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

struct Args {
	int n2 = 2048;
	int slices = 16;
	double lambda = 0.693147;
	double epsilon = 0.02;
	long long attempts = 0;      // 0: use seconds
	double seconds = 2.0;
	double therm_sweeps = 20.0;  // thermalisation after growth, in units of n2 attempts
	unsigned seed = 1;
	int ref_loop = 1;            // also time Simulation::attemptMove()
};

void usage() {
	std::fprintf(stderr,
		"usage: peer_cdt_bench [--n2 N] [--slices T] [--lambda L] [--epsilon E]\n"
		"                      [--attempts N | --seconds S] [--therm-sweeps K]\n"
		"                      [--seed S] [--no-ref-loop]\n");
}

Args parse(int argc, char** argv) {
	Args a;
	for (int i = 1; i < argc; i++) {
		std::string k = argv[i];
		auto val = [&](void) -> const char* {
			if (i + 1 >= argc) { usage(); std::exit(2); }
			return argv[++i];
		};
		if (k == "--n2") a.n2 = std::atoi(val());
		else if (k == "--slices") a.slices = std::atoi(val());
		else if (k == "--lambda") a.lambda = std::atof(val());
		else if (k == "--epsilon") a.epsilon = std::atof(val());
		else if (k == "--attempts") a.attempts = std::atoll(val());
		else if (k == "--seconds") a.seconds = std::atof(val());
		else if (k == "--therm-sweeps") a.therm_sweeps = std::atof(val());
		else if (k == "--seed") a.seed = static_cast<unsigned>(std::atol(val()));
		else if (k == "--no-ref-loop") a.ref_loop = 0;
		else { usage(); std::exit(2); }
	}
	if (a.n2 <= 0 || a.n2 % 2 || a.slices < 3) {
		std::fprintf(stderr, "n2 must be positive and even, slices >= 3\n");
		std::exit(2);
	}
	return a;
}

struct Counts {
	std::array<long long, 3> tried{{0, 0, 0}};
	std::array<long long, 3> taken{{0, 0, 0}};
	long long n2_sum = 0;
	long long n2_samples = 0;
};

// One proposal with exact per-type bookkeeping. kind: 0 add, 1 delete, 2 flip.
inline void step(std::uniform_int_distribution<>& pick4, Counts& c) {
	int r = pick4(Simulation::rng);
	int kind = r < 2 ? r : 2;
	bool ok;
	if (kind == 0) ok = Simulation::moveAdd();
	else if (kind == 1) ok = Simulation::moveDelete();
	else ok = Simulation::moveFlip();
	c.tried[kind]++;
	c.taken[kind] += ok;
}

}  // namespace

int main(int argc, char** argv) {
	Args a = parse(argc, argv);

	auto t_setup = Clock::now();
	Simulation::rng.seed(a.seed);
	Universe::rng.seed(a.seed + 7919u);
	Simulation::targetVolume = a.n2;
	Simulation::lambda = a.lambda;
	Simulation::epsilon = a.epsilon;
	Universe::create(a.slices);

	// Growth from the initial 2 * 3 * T strip with the peer's own attemptMove().
	long long grow_attempts = 0;
	while (Triangle::size() < a.n2) {
		for (int i = 0; i < a.n2; i++) Simulation::attemptMove();
		grow_attempts += a.n2;
	}
	long long therm_attempts = static_cast<long long>(a.therm_sweeps * a.n2);
	for (long long i = 0; i < therm_attempts; i++) Simulation::attemptMove();
	double setup_s = since(t_setup);

	std::uniform_int_distribution<> pick4(0, 3);
	Counts c;
	const int chunk = 1 << 16;
	long long done = 0;
	auto t0 = Clock::now();
	double cpu0 = cpu_now();
	double elapsed = 0.0;
	for (;;) {
		long long n = chunk;
		if (a.attempts > 0) n = std::min<long long>(chunk, a.attempts - done);
		if (n <= 0) break;
		for (long long i = 0; i < n; i++) step(pick4, c);
		done += n;
		c.n2_sum += Triangle::size();
		c.n2_samples++;
		elapsed = since(t0);
		if (a.attempts <= 0 && elapsed >= a.seconds) break;
	}
	elapsed = since(t0);
	double cpu_s = cpu_now() - cpu0;

	// Reference loop: the peer's own attemptMove(), same number of attempts.
	long long ref_n = 0, ref_acc = 0;
	double ref_s = 0.0, ref_cpu = 0.0;
	if (a.ref_loop) {
		auto t1 = Clock::now();
		double c1 = cpu_now();
		for (long long i = 0; i < done; i++) ref_acc += (Simulation::attemptMove() != 0);
		ref_s = since(t1);
		ref_cpu = cpu_now() - c1;
		ref_n = done;
	}

	long long acc = c.taken[0] + c.taken[1] + c.taken[2];
	const char* names[3] = {"add", "delete", "flip"};
	std::string moves;
	for (int k = 0; k < 3; k++) {
		char buf[256];
		double rate = c.tried[k] ? static_cast<double>(c.taken[k]) / c.tried[k] : 0.0;
		std::snprintf(buf, sizeof buf,
			"%s\"%s\": {\"attempted\": %lld, \"accepted\": %lld, \"rate\": %.6f}",
			k ? ", " : "", names[k], c.tried[k], c.taken[k], rate);
		moves += buf;
	}
	std::printf(
		"{\"peer\": \"JorenB/2d-cdt\", \"n2_target\": %d, \"n_slices\": %d, "
		"\"lambda\": %.6f, \"epsilon\": %.4f, \"seed\": %u, "
		"\"attempts\": %lld, \"accepted\": %lld, \"seconds\": %.6f, "
		"\"attempts_per_s\": %.1f, \"accepted_per_s\": %.1f, "
		"\"cpu_seconds\": %.6f, \"attempts_per_cpu_s\": %.1f, "
		"\"acceptance\": %.6f, \"accept_by_move\": {%s}, "
		"\"n2_final\": %d, \"n0_final\": %d, \"n2_mean\": %.2f, "
		"\"setup_seconds\": %.3f, \"grow_attempts\": %lld, \"therm_attempts\": %lld, "
		"\"ref_attemptMove\": {\"attempts\": %lld, \"accepted\": %lld, \"seconds\": %.6f, "
		"\"attempts_per_s\": %.1f, \"cpu_seconds\": %.6f, \"attempts_per_cpu_s\": %.1f}}\n",
		a.n2, a.slices, a.lambda, a.epsilon, a.seed,
		done, acc, elapsed,
		done / elapsed, acc / elapsed,
		cpu_s, cpu_s > 0 ? done / cpu_s : 0.0,
		done ? static_cast<double>(acc) / done : 0.0, moves.c_str(),
		Triangle::size(), Vertex::size(),
		c.n2_samples ? static_cast<double>(c.n2_sum) / c.n2_samples : 0.0,
		setup_s, grow_attempts, therm_attempts,
		ref_n, ref_acc, ref_s, ref_s > 0 ? ref_n / ref_s : 0.0,
		ref_cpu, ref_cpu > 0 ? ref_n / ref_cpu : 0.0);
	std::fflush(stdout);
	return 0;
}
