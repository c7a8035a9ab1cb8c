// Measurement driver for the JorenB/3d-cdt reference code (2+1D CDT, benchmark peer).
//
// Written for ivhl_jax's benchmarks; it contains no code from 3d-cdt, it only #includes its headers and
// links against its objects (everything but its main.cpp, plus observables/volume_profile.cpp).
//
// It does what the peer's own main.cpp does (read the peer's config file with the peer's ConfigReader,
// Universe::initialize from the geometry file, Simulation::start with thermal and measurement sweeps), with
// two observables: the peer's VolumeProfile (spatial triangles per slice) and the counts below, which the
// peer does not print. Both are measured by the peer at the same moments (after every thermal sweep, and
// after every measurement sweep once N(3,1) sits exactly at the target volume). It then times the peer's
// public Simulation::attemptMove() for a given number of attempts at the thermalised state.
//
// Usage: peer_cdt3_bench CONFIG TIMED_ATTEMPTS (CONFIG: the peer's key-value format, plus optional `epsilon`)
// Output: the peer's per-sweep lines, then one JSON line on stdout.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <array>

// Simulation::epsilon (the volume-fixing strength) is a private static the peer never reads from its config;
// this translation unit (and only this one) sees it after `#define private public` so that the config's
// optional `epsilon` key can set it. Simulation has only static members, so nothing else changes.
#include "config.hpp"
#define private public
#include "simulation.hpp"
#undef private
#include "universe.hpp"
#include "observable.hpp"
#include "observables/volume_profile.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double cpu_now() {
	timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// N0, N(3,1), N(1,3), N(2,2), N3 counted from the peer's bags, one line per measurement.
class Counts : public Observable {
public:
	explicit Counts(std::string id) : Observable(id) { name = "counts"; }

	void process() override {
		long n31 = 0, n13 = 0, n22 = 0;
		for (auto t : Universe::tetrasAll) {
			if (t->is31()) n31++;
			else if (t->is13()) n13++;
			else n22++;
		}
		output = std::to_string(Universe::verticesAll.size()) + " " + std::to_string(n31) + " " +
			std::to_string(n13) + " " + std::to_string(n22) + " " + std::to_string(Universe::tetrasAll.size());
	}

private:
	void initialize() override {}
};

}  // namespace

int main(int argc, const char* argv[]) {
	if (argc < 3) {
		fprintf(stderr, "usage: %s CONFIG TIMED_ATTEMPTS\n", argv[0]);
		return 2;
	}
	ConfigReader cfr;
	cfr.read(argv[1]);
	const long timed = std::stol(argv[2]);

	const double k0 = cfr.getDouble("k0");
	const double k3 = cfr.getDouble("k3");
	const int target = cfr.getInt("targetvolume");
	const int thermal = cfr.getInt("thermalsweeps");
	const int sweeps = cfr.getInt("measuresweeps");
	const int ksteps = cfr.getInt("ksteps");
	const std::string fid = cfr.getString("fileid");
	Observable::data_dir = cfr.getString("outputdir");
	// Optional key, read only here; without it the peer's own default stays.
	if (!cfr.getString("epsilon").empty()) Simulation::epsilon = cfr.getDouble("epsilon");

	if (!Universe::initialize(cfr.getString("infile"), fid, cfr.getInt("strictness"), cfr.getInt("volfixswitch"))) {
		fprintf(stderr, "could not read the geometry %s\n", cfr.getString("infile").c_str());
		return 3;
	}

	VolumeProfile profile(fid);
	Counts counts(fid);
	Simulation::addObservable3d(profile);
	Simulation::addObservable3d(counts);

	auto t0 = Clock::now();
	double c0 = cpu_now();
	Simulation::start(k0, k3, sweeps, thermal, ksteps, target, cfr.getInt("target2volume"), cfr.getInt("seed"),
		cfr.getString("outfile"), cfr.getInt("v1"), cfr.getInt("v2"), cfr.getInt("v3"));
	const double run_wall = since(t0), run_cpu = cpu_now() - c0;

	// Timed loop: the peer's own attemptMove() (move choice, MH test, move) at the thermalised state.
	// Return codes: +-1 add (2,6), +-2 delete (6,2), +-3 flip (4,4), +-4 shift (2,3), +-5 inverse shift (3,2).
	std::array<long, 6> tried{}, taken{};
	t0 = Clock::now();
	c0 = cpu_now();
	for (long i = 0; i < timed; i++) {
		const int r = Simulation::attemptMove();
		const int m = r < 0 ? -r : r;
		tried[m]++;
		if (r > 0) taken[m]++;
	}
	const double wall = since(t0), cpu = cpu_now() - c0;
	long acc = 0;
	for (int m = 1; m < 6; m++) acc += taken[m];
	const char* names[6] = {"", "add", "delete", "flip", "shift", "ishift"};
	std::string by_move = "{";
	for (int m = 1; m < 6; m++) {
		char buf[160];
		snprintf(buf, sizeof buf, "%s\"%s\": {\"attempted\": %ld, \"accepted\": %ld}", m > 1 ? ", " : "", names[m],
			tried[m], taken[m]);
		by_move += buf;
	}
	by_move += "}";
	printf("{\"k0\": %.17g, \"epsilon\": %.17g, \"k3_tuned\": %.17g, \"target\": %d, \"thermal_sweeps\": %d, \"measure_sweeps\": %d, "
		"\"ksteps\": %d, \"run_seconds\": %.6g, \"run_cpu_seconds\": %.6g, \"attempts\": %ld, \"accepted\": %ld, "
		"\"seconds\": %.6g, \"cpu_seconds\": %.6g, \"attempts_per_s\": %.6g, \"attempts_per_cpu_s\": %.6g, "
		"\"accept_by_move\": %s, \"n3_final\": %d, \"n31_final\": %d}\n",
		k0, Simulation::epsilon, Simulation::k3, target, thermal, sweeps, ksteps, run_wall, run_cpu, timed, acc, wall, cpu,
		wall > 0 ? timed / wall : 0.0, cpu > 0 ? timed / cpu : 0.0, by_move.c_str(), Universe::tetrasAll.size(),
		Universe::tetras31.size());
	return 0;
}
